//! deploy/: the container recipe and the Kubernetes manifests parse, and agree with each
//! other and with the server (ports, probe paths, the CLI arguments, the metric names the
//! autoscaler reads).

use clap::Parser;
use dsc_runtime::cli::ServeArgs;
use serde::Deserialize;
use serde_yaml_ng::Value;

fn read(p: &str) -> String {
    std::fs::read_to_string(dsc_tests::root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn docs(p: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(&read(p)).map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{p}: {e}"))).collect()
}

fn kind<'a>(d: &'a [Value], k: &str) -> &'a Value {
    d.iter().find(|x| x["kind"].as_str() == Some(k)).unwrap_or_else(|| panic!("no {k}"))
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}
#[derive(clap::Subcommand)]
enum Cmd {
    Serve(ServeArgs),
}

#[test]
fn manifests_and_dockerfile_agree_with_the_server() {
    let dockerfile = read("deploy/Dockerfile");
    let entry = dockerfile.lines().find(|l| l.starts_with("ENTRYPOINT")).expect("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry.trim_start_matches("ENTRYPOINT").trim()).expect("ENTRYPOINT in exec form");
    assert_eq!(entry[0], "dsc-runtime", "the image runs the runtime-only binary");
    assert!(dockerfile.contains("cargo build --release -p dsc-runtime"), "the image builds without LLVM/MLIR");
    assert!(dockerfile.contains("EXPOSE 8000") && dockerfile.contains("NCCL_NVLS_ENABLE=0"));

    let dep = docs("deploy/k8s/deployment.yaml");
    let d = kind(&dep, "Deployment");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let port = &c["ports"][0];
    assert_eq!((port["name"].as_str(), port["containerPort"].as_u64()), (Some("http"), Some(8000)));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"].as_str(), Some("/ready"));
    assert_eq!(c["startupProbe"]["httpGet"]["path"].as_str(), Some("/ready"));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"].as_str(), Some("/health"));
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"].as_u64(), Some(1));
    // the container's command line (entrypoint + args) is one the CLI accepts
    let args: Vec<String> = c["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let argv: Vec<String> = entry.into_iter().chain(args).collect();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Cmd::Serve(a) = cli.cmd;
    assert_eq!((a.host.as_str(), a.port), ("0.0.0.0", 8000));
    // the API key comes from a secret the pod cannot start without
    let key_file = a.api_key_file.as_ref().expect("--api-key-file in the container's args");
    let vols = d["spec"]["template"]["spec"]["volumes"].as_sequence().unwrap();
    let secret = vols.iter().find(|v| v["secret"].is_mapping()).expect("a secret volume");
    assert_eq!(secret["secret"]["optional"].as_bool(), Some(false), "the API key secret is required");
    let mount = c["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"] == secret["name"]).expect("the secret is mounted");
    assert!(key_file.starts_with(mount["mountPath"].as_str().unwrap()), "--api-key-file {} is inside the secret's mount", key_file.display());
    assert!(!c["env"].as_sequence().unwrap().iter().any(|e| e["name"] == "DSC_API_KEY"), "no optional key from the environment");
    let svc = kind(&dep, "Service");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"].as_str(), Some("http"));
    assert_eq!(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]);

    let hpa = docs("deploy/k8s/hpa.yaml");
    let h = kind(&hpa, "HorizontalPodAutoscaler");
    assert_eq!(h["spec"]["scaleTargetRef"]["name"], d["metadata"]["name"]);
    // every metric the autoscaler reads is one the server exports
    let m = dsc_runtime::metrics::Metrics::new();
    // GPU gauges appear once NVML reports (none on this machine): give them a value
    m.gpu_utilization.get_or_create(&dsc_runtime::metrics::GpuLabel { gpu: "0".into() }).set(50.0);
    let exported = m.encode();
    for m in h["spec"]["metrics"].as_sequence().unwrap() {
        let name = m["pods"]["metric"]["name"].as_str().unwrap();
        assert!(exported.contains(&format!("# TYPE {name} ")), "HPA metric {name} is not exported:\n{exported}");
    }
    let rules = docs("deploy/k8s/prometheus-adapter-rules.yaml");
    assert_eq!(rules[0]["rules"].as_sequence().unwrap().len(), 2);
}
