//! CI's bounded fuzz pass: every target, a few thousand mutated inputs each, no panic. (The
//! long run is `cargo run --release -p dsc-fuzz -- --execs 1000000`, in its own processes
//! under a memory limit: docs/fuzzing.md.)

#[test]
fn every_parser_survives_a_bounded_fuzz_pass() {
    let mut report = vec![];
    for t in dsc_fuzz::TARGETS {
        let mut first = None;
        let c = dsc_fuzz::run(
            t,
            3000,
            42,
            |_| {},
            |input, msg| {
                first.get_or_insert((String::from_utf8_lossy(input).chars().take(300).collect::<String>(), msg));
            },
        );
        assert_eq!(c.execs, 3000);
        if let Some((input, msg)) = first {
            panic!("fuzz target `{t}` panicked {} times; first: {msg}\ninput: {input:?}", c.panics);
        }
        // (the mutants reach past the first checks: some are accepted, most rejected)
        assert!(c.rejected > 0, "`{t}`: no mutant was rejected");
        report.push(format!("{t}: {} accepted, {} rejected", c.accepted, c.rejected));
    }
    eprintln!("{}", report.join("\n"));
}
