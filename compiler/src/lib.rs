//! The compile pipeline, readable in one function: [`compile`].
//!
//! Stages, in order: `graph` (built from model.toml and verified) → passes (verified after
//! each; `optimized`) → kernels (`mlir`: generated and lowered MLIR, `llvm`, `ptx`) → `plan`.
//! The e-graph stages (`egraph`, `fused`) arrive with the optimizer.

pub mod cost;
pub mod gpu_bundle;

use anyhow::Context;
use dsc_models::LoadedModel;
use dsc_passes::{run_pipeline, Dce, PassReport, TensorParallel};
use dsc_runtime::plan::{GpuLarge, GpuProgram, GpuStep, LaunchKind, ModelMeta, PlanHeader, PlanTokenizer, PlanWeights, Scalar, SeededWeight, SourceFile, WeightData, PLAN_FORMAT_VERSION};
use sha2::Digest;
use std::path::Path;

/// The stages `--dump-ir` knows today.
/// (`schedule` also takes `schedule@REWRITE`: the schedule right after that rewrite.)
pub const STAGES: &[&str] = &["graph", "egraph", "optimized", "schedule", "mlir", "llvm", "ptx", "plan"];

pub struct Compiled {
    pub model: LoadedModel,
    pub graph: dsc_ir::Graph,
    pub reports: Vec<PassReport>,
    /// the GPU program, or why there is none
    pub gpu: Option<GpuProgram>,
    pub gpu_skipped: Option<String>,
    /// the kernels' MLIR, lowered MLIR, LLVM IR (the dump stages)
    pub kernels: Option<dsc_codegen::CompiledModule>,
    /// the launch schedule as text after the first lowering and after every rewrite that ran,
    /// by name (`--dump-ir=schedule`)
    pub schedule: Vec<(String, String)>,
    /// ranks the graph was partitioned for (1: whole model on one GPU)
    pub tensor_parallel: usize,
    /// the CPU program (compiled x86-64 matmul kernels), or why there is none
    pub cpu: Option<dsc_runtime::plan::CpuProgram>,
    pub cpu_skipped: Option<String>,
}

/// Everything a compile can be asked to do differently. `Default`: what `dsc compile` does with
/// no flags and no `DSC_*` variables.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// tensor-parallel ranks, overriding model.toml's `[parallel] tp` (neither: not partitioned)
    pub tp: Option<usize>,
    /// run the equality-saturation optimizer (`dsc compile --no-optimize` turns it off)
    pub optimize: bool,
    /// optimizer rules turned on or off by name (`--rule NAME=on|off`)
    pub rules: Vec<(String, bool)>,
    /// the code generator's choices (written into the plan)
    pub codegen: dsc_codegen::CodegenOptions,
    /// `--quant` / `--calibration` over model.toml's `[precision]`
    pub precision: dsc_models::PrecisionOverride,
    /// the C compiler driver that links the CPU kernels into shared libraries (`dsc compile`:
    /// `$CC`, else `cc`)
    pub cc: String,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { tp: None, optimize: true, rules: vec![], codegen: Default::default(), precision: Default::default(), cc: "cc".into() }
    }
}

/// The code generator's options from the process environment's `DSC_*` variables (the one
/// place they are read; the `dsc` CLI calls it). A bad value is an error naming the variable.
pub fn codegen_options_from_env() -> anyhow::Result<dsc_codegen::CodegenOptions> {
    dsc_codegen::CodegenOptions::from_vars(&|k| std::env::var(k).ok()).map_err(|e| anyhow::anyhow!("code generator options from the environment: {e}"))
}

/// model.toml → verified, optimized graph (+ weights and tokenizer), with the default options.
pub fn compile(model_toml: &Path) -> anyhow::Result<Compiled> {
    compile_full(model_toml, &CompileOptions::default())
}

/// `optimize`: run the equality-saturation optimizer (on by default; `dsc compile
/// --no-optimize` turns it off for A/B comparisons).
pub fn compile_opts(model_toml: &Path, tp: Option<usize>, optimize: bool) -> anyhow::Result<Compiled> {
    compile_full(model_toml, &CompileOptions { tp, optimize, ..Default::default() })
}

/// As [`compile_opts`], turning optimizer rules on or off by name (`dsc compile --rule
/// NAME=on|off`; rules whose kernels are not yet checked on the GPU start off).
pub fn compile_rules(model_toml: &Path, tp: Option<usize>, optimize: bool, rules: &[(String, bool)]) -> anyhow::Result<Compiled> {
    compile_full(model_toml, &CompileOptions { tp, optimize, rules: rules.to_vec(), ..Default::default() })
}

/// `tp`: tensor-parallel ranks, overriding model.toml's `[parallel] tp`; with neither the
/// graph is not partitioned. The optimizer runs.
pub fn compile_with(model_toml: &Path, tp: Option<usize>) -> anyhow::Result<Compiled> {
    compile_full(model_toml, &CompileOptions { tp, ..Default::default() })
}

/// The compile with every option explicit.
pub fn compile_full(model_toml: &Path, o: &CompileOptions) -> anyhow::Result<Compiled> {
    let (tp, optimize, rules) = (o.tp, o.optimize, &o.rules[..]);
    let model = dsc_models::load_with(model_toml, &o.precision)?;
    let world = tp.or(model.config.toml.parallel.as_ref().map(|p| p.tp));
    if world == Some(0) {
        anyhow::bail!("--tp must be at least 1");
    }
    let tpp = world.map(|world| TensorParallel { world });
    let mut opt = dsc_passes::Optimize::default();
    for (name, on) in rules {
        opt.set_rule(name, *on).map_err(|m| anyhow::anyhow!("--rule: {m}"))?;
    }
    // partition before fusing: a row-parallel matmul's residual add must follow its
    // all_reduce, so it must not become the matmul's epilogue
    let mut passes: Vec<&dyn dsc_passes::Pass> = vec![&Dce];
    if let Some(p) = &tpp {
        passes.push(p);
    }
    if optimize {
        passes.push(&opt);
    }
    let (graph, reports) = run_pipeline(model.graph.clone(), &passes)?;
    let tensor_parallel = world.unwrap_or(1);
    let mut schedule = vec![];
    let (gpu, gpu_skipped, kernels) = match lower_gpu_traced(&graph, &o.codegen, &mut |name, steps| schedule.push((name.to_string(), dsc_codegen::schedule::print(steps)))) {
        Ok((p, m)) => (Some(p), None, Some(m)),
        Err(e) => {
            tracing::warn!(target: "dsc::codegen", "no GPU program: {e}");
            (None, Some(e.to_string()), None)
        }
    };
    let (cpu, cpu_skipped) = match lower_cpu(&graph, &o.cc) {
        Ok(Some(p)) => (Some(p), None),
        Ok(None) => (None, Some("no matmul weight the CPU kernels take".to_string())),
        Err(e) => {
            tracing::warn!(target: "dsc::codegen", "no CPU program: {e}");
            (None, Some(e.to_string()))
        }
    };
    Ok(Compiled { model, graph, reports, gpu, gpu_skipped, kernels, schedule, tensor_parallel, cpu, cpu_skipped })
}

/// The weight types of the graph's `x · Wᵀ` matmuls that the CPU kernels take
/// (`dsc_codegen::cpu::matmul::fits`), in first-use order.
pub fn cpu_matmul_dtypes(graph: &dsc_ir::Graph) -> Vec<dsc_ir::DType> {
    let mut out = vec![];
    for id in graph.node_ids() {
        let n = graph.node(id);
        let ops = graph.operands(id);
        let weights: &[dsc_ir::NodeId] = match n.op {
            dsc_ir::Op::MatMul { transpose_b: true } | dsc_ir::Op::MatMulAct { transpose_b: true, .. } | dsc_ir::Op::MatMulAdd { transpose_b: true } => &ops[1..2],
            dsc_ir::Op::MatMulCat => &ops[1..],
            _ => continue,
        };
        for &w in weights {
            let wn = graph.node(w);
            let dims: Option<Vec<usize>> = wn.ty.shape.iter().map(|d| d.as_const()).collect();
            if let (dsc_ir::Op::Weight, Some([r, c])) = (&wn.op, dims.as_deref()) {
                // (i4g128 is laid out for Q4_1's kernels when the plan loads)
                let kd = dsc_ir::quant::cpu_kernel_dtype(wn.ty.dtype);
                if dsc_codegen::cpu::matmul::fits(kd, *r, *c) && !out.contains(&kd) {
                    out.push(kd);
                }
            }
        }
    }
    out
}

/// Build the CPU kernels the graph's matmuls use, for every x86-64 level, linked by the C
/// compiler driver `cc` (None: none apply).
pub fn lower_cpu(graph: &dsc_ir::Graph, cc: &str) -> Result<Option<dsc_runtime::plan::CpuProgram>, dsc_codegen::CodegenError> {
    use base64::Engine as _;
    let dtypes = cpu_matmul_dtypes(graph);
    if dtypes.is_empty() {
        return Ok(None);
    }
    let m = dsc_codegen::cpu::compile_cpu(&dtypes, cc)?;
    Ok(Some(dsc_runtime::plan::CpuProgram {
        matmul_dtypes: m.dtypes.iter().map(|d| d.name().to_string()).collect(),
        libraries: m.libraries.iter().map(|(t, so)| (t.name().to_string(), base64::engine::general_purpose::STANDARD.encode(so))).collect(),
        layout: dsc_ir::quant::CPU_LAYOUT,
    }))
}

fn scalar(s: &dsc_codegen::schedule::Scalar) -> Scalar {
    use dsc_codegen::schedule::Scalar as S;
    match s {
        S::Const(v) => Scalar::Const(*v),
        S::Numel(n) => Scalar::Numel(n.clone()),
        S::Rows(n) => Scalar::Rows(n.clone()),
        S::Dim(n, i) => Scalar::Dim(n.clone(), *i),
        S::HalfNumel(n) => Scalar::HalfNumel(n.clone()),
        S::RowsTimes(n, c) => Scalar::RowsTimes(n.clone(), *c),
    }
}

/// Lower the graph to kernels and a launch schedule, and emit PTX for every target, as `o`
/// says (recorded in the program).
pub fn lower_gpu(graph: &dsc_ir::Graph, o: &dsc_codegen::CodegenOptions) -> Result<(GpuProgram, dsc_codegen::CompiledModule), dsc_codegen::CodegenError> {
    lower_gpu_traced(graph, o, &mut |_, _| {})
}

/// [`lower_gpu`], handing `seen` the schedule after the first lowering and every rewrite.
pub fn lower_gpu_traced(
    graph: &dsc_ir::Graph,
    o: &dsc_codegen::CodegenOptions,
    seen: &mut dyn FnMut(&str, &[dsc_codegen::schedule::Step]),
) -> Result<(GpuProgram, dsc_codegen::CompiledModule), dsc_codegen::CodegenError> {
    let steps = dsc_codegen::schedule::lower_traced(graph, &o.schedule, seen)?;
    let mut specs: Vec<dsc_codegen::KernelSpec> = steps.iter().filter_map(|s| s.kernel.clone()).collect();
    specs.extend(steps.iter().flat_map(|s| s.alternatives().map(|l| l.kernel.clone())));
    // generators for seeded weights (benchmark plans generate their weights on the device)
    // (f32/bf16/f16 always; any other weight format of the graph the generator takes, e.g.
    // Q4_1: the quantized shapes' benchmark plans)
    let mut seeded = vec![dsc_ir::DType::F32, dsc_ir::DType::BF16, dsc_ir::DType::F16];
    for n in graph.node_ids().map(|id| graph.node(id)).filter(|n| matches!(n.op, dsc_ir::Op::Weight)) {
        if !seeded.contains(&n.ty.dtype) {
            seeded.push(n.ty.dtype);
        }
    }
    specs.extend(seeded.into_iter().map(|dtype| dsc_codegen::KernelSpec::SeededInit { dtype }).filter(|s| dsc_codegen::kernels::fits(s).is_ok()));
    // greedy decoding picks tokens on the device: an argmax over the logits rows
    let logits = graph.outputs.iter().find(|(n, _)| n == "logits").map(|(_, id)| graph.node(*id));
    let argmax = logits.and_then(|l| l.ty.shape.last().and_then(|d| d.as_const())).map(|d| dsc_codegen::KernelSpec::Argmax { d });
    specs.extend(argmax.clone());
    // (and over several blocks per row, `argmax_split`; on sm_90a over a thread-block cluster
    // per row, `argmax_cluster`): (kernel, blocks per row)
    let split = match &argmax {
        Some(dsc_codegen::KernelSpec::Argmax { d }) if o.schedule.argmax_split => {
            dsc_codegen::kernels::argmax_splits(*d).map(|splits| (dsc_codegen::KernelSpec::ArgmaxSplit { d: *d, splits }, splits))
        }
        _ => None,
    };
    let cluster = match (&argmax, &split) {
        (Some(dsc_codegen::KernelSpec::Argmax { d }), Some(_)) if o.schedule.argmax_cluster => {
            let blocks = dsc_codegen::kernels::ARGMAX_CLUSTER_BLOCKS;
            Some((dsc_codegen::KernelSpec::ArgmaxCluster { d: *d, blocks }, blocks))
        }
        _ => None,
    };
    specs.extend(split.iter().chain(&cluster).map(|(k, _)| k.clone()));
    // (and folded into the logits step's default kernel where that is the wide lm_head:
    // `KernelSpec::ArgmaxFold`, for chained multi-step graphs; `ScheduleOptions::argmax_fold`)
    // — (node, kernel)
    let fold_on = argmax.is_some() && o.schedule.argmax_fold;
    let fold = steps.iter().filter(|s| fold_on && logits.is_some_and(|l| l.name == s.node)).find_map(|s| {
        let f = dsc_codegen::KernelSpec::ArgmaxFold { inner: Box::new(s.kernel.clone()?) };
        dsc_codegen::kernels::fits(&f).is_ok().then(|| (s.node.clone(), f))
    });
    specs.extend(fold.iter().map(|(_, k)| k.clone()));
    let module = dsc_codegen::compile_kernels(&specs, &dsc_codegen::GpuTarget::ALL, &o.kernels)?;
    // (every kernel by the symbol the module compiled it under: the readable name, with a hash
    // of the whole spec where two specs share that name)
    let sym = |k: &dsc_codegen::KernelSpec| module.symbol_of(k).map(str::to_string).unwrap_or_else(|| k.symbol());
    let steps: Vec<GpuStep> = steps
        .iter()
        .map(|s| {
            let shape = launch_shape;
            let (launch, block, _, threads) = shape(s.kernel.as_ref().map(|k| k.launch()));
            let big = |l: &dsc_codegen::schedule::Large| {
                let (launch, block, rows_per_block, threads) = shape(Some(l.kernel.launch()));
                GpuLarge {
                    min_rows: l.min_rows,
                    max_rows: l.max_rows,
                    args: l.args.clone(),
                    rows_per_block,
                    threads,
                    smem: match l.kernel.launch() {
                        dsc_codegen::Launch::Tile { smem, .. } => Some(smem),
                        _ => None,
                    },
                    carveout: matches!(l.kernel.launch(), dsc_codegen::Launch::Tile { carveout: true, .. }),
                    kernel: sym(&l.kernel),
                    scalars: l.scalars.iter().map(scalar).collect(),
                    launch,
                    block,
                    work: scalar(&l.work),
                    grid_y: scalar(&l.grid_y),
                    cluster: l.kernel.cluster(),
                }
            };
            let large = s.large.as_ref().map(big);
            let hopper = s.hopper.iter().map(big).collect();
            let hopper_small = s.hopper_small.as_ref().map(big);
            let few = s.few.iter().map(big).collect();
            GpuStep {
                node: s.node.clone(),
                kernel: s.kernel.as_ref().map(sym),
                args: s.args.clone(),
                scalars: s.scalars.iter().map(scalar).collect(),
                launch,
                block,
                threads,
                work: scalar(&s.work),
                grid_y: scalar(&s.grid_y),
                alias_of: s.alias_of.clone(),
                alias_offset: s.alias_offset.as_ref().map(scalar),
                min_rows: s.min_rows,
                max_rows: s.max_rows,
                min_context: s.min_context,
                max_context: s.max_context,
                hopper_only: s.hopper_only,
                hopper_skip: s.hopper_skip,
                large,
                hopper,
                hopper_small,
                few,
                collective: s.collective.clone(),
                cluster: s.kernel.as_ref().and_then(|k| k.cluster()),
                argmax: fold.as_ref().filter(|(n, _)| *n == s.node).map(|(_, k)| sym(k)),
            }
        })
        .collect();
    let ptx = module.ptx.iter().map(|(t, p)| (t.name().to_string(), p.clone())).collect();
    let buffers = lifetimes(graph, &steps);
    let argmax_block = match argmax.as_ref().map(|k| k.launch()) {
        Some(dsc_codegen::Launch::BlockPerRow { warps }) => Some(32 * warps),
        _ => None,
    };
    // (the block's threads from the kernel's launch, as `argmax_block`'s)
    let entry = |(k, n): (dsc_codegen::KernelSpec, usize)| {
        let threads = match k.launch() {
            dsc_codegen::Launch::BlockPerRow { warps } => 32 * warps,
            _ => 32,
        };
        dsc_runtime::plan::ArgmaxSplit { kernel: sym(&k), splits: n as u32, threads }
    };
    let (argmax_split, argmax_cluster) = (split.map(entry), cluster.map(entry));
    let argmax = argmax.as_ref().map(sym);
    let codegen_options = Some(serde_json::to_value(o).map_err(|e| dsc_codegen::CodegenError::Llvm(format!("the code generator's options as JSON: {e}")))?);
    Ok((GpuProgram { ptx, steps, buffers, argmax, argmax_block, argmax_split, argmax_cluster, codegen_options }, module))
}

/// Liveness of every activation buffer over the schedule (aliases resolved to their root;
/// graph outputs live to the end).
fn lifetimes(graph: &dsc_ir::Graph, steps: &[GpuStep]) -> Vec<dsc_runtime::plan::BufferLife> {
    use std::collections::HashMap;
    let mut root: HashMap<&str, &str> = HashMap::new();
    let mut life: Vec<dsc_runtime::plan::BufferLife> = vec![];
    let mut index: HashMap<&str, usize> = HashMap::new();
    // every buffer's defining step, and the root of every alias
    for (i, s) in steps.iter().enumerate() {
        match &s.alias_of {
            Some(of) => {
                let r = root.get(of.as_str()).copied().unwrap_or(of.as_str());
                root.insert(s.node.as_str(), r);
            }
            // (a node two steps write — the one-pass and the split attention's merge, for
            // different context classes — is one buffer)
            None if !index.contains_key(s.node.as_str()) => {
                index.insert(s.node.as_str(), life.len());
                life.push(dsc_runtime::plan::BufferLife { node: s.node.clone(), first: i, last: i });
            }
            None => {}
        }
    }
    // then every step that names a buffer, in any kernel it may launch (the alternatives can
    // read other buffers), extends its life both ways: a fused kernel may write a buffer
    // before the buffer's own (then kernel-less) step
    for (i, s) in steps.iter().enumerate() {
        let alt_args = s.large.iter().chain(&s.hopper).chain(&s.hopper_small).chain(&s.few).filter_map(|l| l.args.as_ref()).flatten();
        for a in s.args.iter().chain(s.alias_of.iter()).chain(alt_args) {
            let r = root.get(a.as_str()).copied().unwrap_or(a.as_str());
            if let Some(&j) = index.get(r) {
                life[j].first = life[j].first.min(i);
                life[j].last = life[j].last.max(i);
            }
        }
    }
    for (_, id) in &graph.outputs {
        let n = graph.node(*id).name.as_str();
        let r = root.get(n).copied().unwrap_or(n);
        if let Some(&j) = index.get(r) {
            life[j].last = steps.len();
        }
    }
    life
}

/// How the plan launches a kernel of launch `l` (None: no kernel): (launch kind, block,
/// activation rows per block, threads where the kind needs them). With
/// `LaunchKind::dims` this is the runtime's launch geometry; the kernel-check bundle uses the same.
pub fn launch_shape(l: Option<dsc_codegen::Launch>) -> (LaunchKind, u32, u32, Option<u32>) {
    match l {
        Some(dsc_codegen::Launch::PerElement { threads }) => (LaunchKind::PerElement, threads, 1, None),
        Some(dsc_codegen::Launch::WarpPerRow { rows_per_block }) => (LaunchKind::WarpPerRow, rows_per_block, 1, None),
        Some(dsc_codegen::Launch::WarpPerOutput { warps_per_block }) => (LaunchKind::WarpPerOutput, warps_per_block, 1, None),
        Some(dsc_codegen::Launch::WarpPerTile { warps_per_block }) => (LaunchKind::WarpPerTile, warps_per_block, 1, None),
        Some(dsc_codegen::Launch::WarpgroupPerTile { .. }) => (LaunchKind::WarpgroupPerTile, 4, 1, None),
        Some(dsc_codegen::Launch::BlockPerRow { warps }) => (LaunchKind::BlockPerRow, warps, 1, None),
        Some(dsc_codegen::Launch::OutputsPerBlock { outputs, rows, warps }) => (LaunchKind::OutputsPerBlock, outputs, rows, Some(32 * warps)),
        // (the same grid; its dynamic shared memory goes into `smem`)
        Some(dsc_codegen::Launch::Tile { outputs, rows, threads, .. }) => (LaunchKind::OutputsPerBlock, outputs, rows, Some(threads)),
        None => (LaunchKind::None, 0, 1, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(node: &str, args: &[&str], alias_of: Option<&str>) -> GpuStep {
        GpuStep {
            node: node.into(),
            kernel: Some("k".into()),
            args: args.iter().map(|a| a.to_string()).collect(),
            scalars: vec![],
            launch: LaunchKind::PerElement,
            block: 256,
            threads: None,
            work: Scalar::Const(1),
            grid_y: Scalar::Const(1),
            alias_of: alias_of.map(String::from),
            alias_offset: None,
            min_rows: None,
            max_rows: None,
            min_context: None,
            max_context: None,
            hopper_only: false,
            hopper_skip: None,
            large: None,
            hopper: vec![],
            hopper_small: None,
            few: vec![],
            collective: None,
            cluster: None,
            argmax: None,
        }
    }

    #[test]
    fn a_buffer_written_before_its_own_step_lives_from_that_write() {
        let g =
            dsc_ir::text::parse("graph \"t\" {\n  %x = input : f32[4]\n  %a = neg(%x) : f32[4]\n  %v = reshape(%a) : f32[4]\n  %b = neg(%v) : f32[4]\n  %c = neg(%b) : f32[4]\n  output c = %c\n}\n")
                .unwrap();
        // step 1 (a kernel fused into `v`'s place) writes b early; b's own step launches nothing
        let steps = vec![step("a", &["x", "a"], None), step("v", &["a", "b"], Some("a")), step("b", &[], None), step("c", &["b", "c"], None)];
        let life = lifetimes(&g, &steps);
        let of = |n: &str| life.iter().find(|l| l.node == n).map(|l| (l.first, l.last)).unwrap();
        assert_eq!(of("b"), (1, 3));
        // a is read through its alias at step 1, c lives to the end (an output)
        assert_eq!(of("a"), (0, 1));
        assert_eq!(of("c"), (3, 4));
    }

    #[test]
    fn a_node_two_steps_write_is_one_buffer() {
        // the one-pass attention (short contexts) and the split attention's merge (long ones)
        // both write `o`: one buffer, living from the first writer to its last reader
        let g = dsc_ir::text::parse("graph \"t\" {\n  %x = input : f32[4]\n  %o = neg(%x) : f32[4]\n  %y = neg(%o) : f32[4]\n  output y = %y\n}\n").unwrap();
        let steps = vec![step("o", &["x", "o"], None), step("o@split16", &["x", "o@split16"], None), step("o", &["o@split16", "o"], None), step("y", &["o", "y"], None)];
        let life = lifetimes(&g, &steps);
        assert_eq!(life.iter().filter(|l| l.node == "o").count(), 1);
        let of = |n: &str| life.iter().find(|l| l.node == n).map(|l| (l.first, l.last)).unwrap();
        assert_eq!(of("o"), (0, 3));
        assert_eq!(of("o@split16"), (1, 2));
    }
}

pub fn plan_header(c: &Compiled) -> anyhow::Result<PlanHeader> {
    let m = &c.model;
    let t = &m.config.toml;
    let source_sha256 = t.weights.sha256.clone();
    Ok(PlanHeader {
        format_version: PLAN_FORMAT_VERSION,
        created_by: format!("dsc {}", env!("CARGO_PKG_VERSION")),
        model: ModelMeta {
            name: t.model.name.clone(),
            architecture: match t.model.architecture {
                dsc_models::config::Architecture::Llama => "llama",
                dsc_models::config::Architecture::Deepseek => "deepseek",
            }
            .into(),
            dims: m.dims_json(),
            max_seq_len: t.limits.max_seq_len,
            kv_block_size: t.limits.kv_block_size,
            max_batch: t.limits.max_batch,
            activations: m.config.activations.to_string(),
            kv_cache: m.config.kv_cache.to_string(),
        },
        targets: std::iter::once("cpu".to_string()).chain(c.gpu.iter().flat_map(|g| g.ptx.keys().cloned())).collect(),
        graph: dsc_ir::text::print(&c.graph),
        tokenizer: m.tokenizer.as_ref().map(|t| PlanTokenizer { json: t.json.clone(), bos_id: t.bos_id, eos_ids: t.eos_ids.clone(), add_bos: t.add_bos, chat_template: t.chat_template.clone() }),
        weights: PlanWeights {
            // (the file's name only: a plan holds no path of the machine that compiled it)
            source: m
                .weights_path
                .as_ref()
                .map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default())
                .unwrap_or_else(|| format!("seeded (seed {})", t.weights.seed.unwrap_or(0))),
            source_sha256,
            total_bytes: 0,
            tensors: vec![],
            files: vec![],
            precision: m.precision.clone(),
        },
        gpu: c.gpu.clone(),
        cpu: c.cpu.clone(),
        tensor_parallel: c.tensor_parallel,
    })
}

/// Write the plan: the graph, and every weight the graph uses, in graph order: embedded, or
/// with `reference`, read at load time from the checkpoint files (kept by path, size and
/// sha256); seeded weights are never stored.
pub fn write(c: &Compiled, out: &Path) -> anyhow::Result<()> {
    write_with(c, out, false)
}

pub fn write_with(c: &Compiled, out: &Path, reference: bool) -> anyhow::Result<()> {
    write_signed(c, out, reference, None)
}

/// [`write_with`], the plan signed with `key` where given (`dsc compile --sign`).
pub fn write_signed(c: &Compiled, out: &Path, reference: bool, key: Option<&ed25519_dalek::SigningKey>) -> anyhow::Result<()> {
    let mut header = plan_header(c)?;
    let order = c.graph.topo_order()?;
    let mut items = vec![];
    let mut files: Vec<std::path::PathBuf> = vec![];
    for id in order {
        let n = c.graph.node(id);
        if matches!(n.op, dsc_ir::Op::Weight) {
            let w = c.model.weights.get(&n.name).with_context(|| format!("weight `{}` vanished", n.name))?;
            let data = match (&w.bytes, w.bytes.seeded()) {
                (_, Some(s)) => WeightData::Seeded(SeededWeight { seed: s.seed, scale: s.scale, ones: s.ones }),
                (dsc_models::weights::Bytes::Mapped { file, offset, len, .. }, None) if reference => {
                    let path = std::fs::canonicalize(file.as_ref()).with_context(|| file.display().to_string())?;
                    let i = match files.iter().position(|f| *f == path) {
                        Some(i) => i,
                        None => {
                            files.push(path);
                            files.len() - 1
                        }
                    };
                    WeightData::Referenced(i, *offset as u64, *len as u64)
                }
                _ => WeightData::Bytes(w.bytes.as_slice()),
            };
            items.push((n.name.clone(), w.dtype, w.shape.clone(), data));
        }
    }
    for f in &files {
        let bytes = std::fs::read(f).with_context(|| f.display().to_string())?;
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).with_context(|| format!("{}: no file name", f.display()))?;
        anyhow::ensure!(!header.weights.files.iter().any(|x: &SourceFile| x.path == name), "referenced weights: two checkpoint files named `{name}` (a plan names them by file name)");
        header.weights.files.push(SourceFile { path: name, len: bytes.len() as u64, sha256: format!("{:x}", sha2::Sha256::digest(&bytes)) });
    }
    dsc_runtime::plan::write_plan_signed(out, header, items, key)?;
    Ok(())
}
