//! The committed fuzz corpora (`fuzz/corpus/<target>/`) replayed through the targets' own
//! checks (`flock::fuzzing`, built here thanks to the `arbitrary` feature the dev-dependency
//! turns on), without libFuzzer; and every ruleset they render loaded with `nft -c` in a
//! throwaway network namespace.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use flock::apply::Backend;
use flock::apply::kernel::NftCli;
use flock::fuzzing;
use flock::testkit::kernel::{NetnsGuard, require_root};

type Target = fn(&[u8]) -> Vec<String>;

const TARGETS: [(&str, Target); 8] = [
    // The replay cross-checks every pipeline input, not a sample.
    ("pipeline", fuzzing::pipeline_full),
    ("manifest", fuzzing::manifest),
    ("hostile_strings", fuzzing::hostile_strings),
    ("fail_closed", fuzzing::fail_closed),
    ("differential", fuzzing::differential),
    ("incremental_steps", fuzzing::incremental),
    ("dns_answer", fuzzing::dns_answer),
    ("dns_exchange", fuzzing::dns_exchange),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The corpus files of `target`, in name order.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

/// Every corpus file through its target; returns the renders, failing with every input whose
/// check failed.
fn replay() -> BTreeSet<String> {
    let mut renders = BTreeSet::new();
    let mut failures = Vec::new();
    for (name, target) in TARGETS {
        let files = corpus(name);
        let mut rendered = 0;
        for (path, data) in &files {
            match std::panic::catch_unwind(|| target(data)) {
                Ok(texts) => {
                    rendered += usize::from(!texts.is_empty());
                    renders.extend(texts);
                }
                Err(e) => {
                    let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                    failures.push(format!("{}: {}", path.display(), msg.unwrap_or_default()));
                }
            }
        }
        eprintln!("{name}: {} inputs, {rendered} rendered", files.len());
    }
    assert!(failures.is_empty(), "{} corpus inputs fail:\n{}", failures.len(), failures.join("\n"));
    renders
}

#[test]
fn corpora_pass_their_targets_checks_and_every_render_loads_in_the_kernel() {
    let renders = replay();
    assert!(renders.len() > 10, "only {} distinct renders", renders.len());
    if !require_root("corpora_pass_their_targets_checks_and_every_render_loads_in_the_kernel") {
        return;
    }
    // `nft -c` commits nothing, so one empty namespace serves every check.
    let ns = NetnsGuard::new("fuzz");
    let mut nft = NftCli::new(ns.netns());
    let mut failures = Vec::new();
    for text in &renders {
        if let Err(e) = nft.check(text) {
            failures.push(format!("{e}\n{text}"));
        }
    }
    assert!(failures.is_empty(), "nft -c rejected {} of {} renders; the first:\n{}", failures.len(), renders.len(), failures[0]);
    eprintln!("nft -c accepted all {} distinct renders", renders.len());
}

/// Found by `cargo fuzz run pipeline` (issue #38): the structure check expected a set's flags
/// to be `interval` or none, and domain rules render timed sets (`flags timeout`). The input
/// renders one; the replay above runs it through the whole check.
#[test]
fn repro_timed_set_renders_a_timed_set_and_passes_the_check() {
    let data = std::fs::read(fuzz_dir().join("corpus/pipeline/repro-timed-set")).unwrap();
    let texts = fuzzing::pipeline_full(&data);
    assert!(texts.iter().any(|t| t.contains("\t\tflags timeout\n")), "the repro no longer renders a timed set:\n{texts:?}");
}

/// Writes seed inputs to `fuzz/target/seeds/<target>/` (not committed): the conformance
/// cases and the quickstart as manifests, each base cluster for the structured targets.
/// Run `cargo test --test fuzz_corpus -- --ignored write_seeds`, then give the directory to
/// `cargo fuzz run` or `cargo fuzz cmin` next to the corpus (docs/development.md, "Fuzzing").
#[test]
#[ignore = "writes seed files; run by hand when reseeding the corpora"]
fn write_seeds() {
    use flock::model::manifest::Object;
    let seeds = fuzz_dir().join("target/seeds");
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = seeds.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), data).unwrap();
    };

    // manifest: a small part of the conformance cluster (every node and namespace, three
    // pods) with each case's objects, step by step; and the quickstart as written.
    let base = flock::testkit::parse_manifests(flock::testkit::BASE_CLUSTER_YAML).objects;
    let small: Vec<Object> = base
        .into_iter()
        .filter(|o| match o {
            Object::Pod(p) => ["x/a", "y/b", "z/c"].contains(&format!("{}/{}", p.namespace, p.name).as_str()),
            _ => true,
        })
        .collect();
    let cases = flock::source::files::find_cases(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")]).unwrap();
    for dir in cases {
        let case = flock::source::files::load_case(&dir).unwrap();
        let mut objects = small.clone();
        for (i, step) in case.steps.iter().enumerate() {
            objects.extend(step.apply.iter().cloned());
            let text = fuzzing::to_manifest(&objects, &Default::default());
            write("manifest", &format!("seed-{}-{i}.yaml", case.dir_name), text.as_bytes());
        }
    }
    let quickstart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/quickstart");
    for f in ["cluster.yaml", "policies.yaml"] {
        write("manifest", &format!("seed-quickstart-{f}"), &std::fs::read(quickstart.join(f)).unwrap());
    }

    // pipeline: each base cluster, nothing added.
    for (i, base) in [fuzzing::Base::Empty, fuzzing::Base::Conformance, fuzzing::Base::Quickstart].into_iter().enumerate() {
        let bytes = (0..=255u8)
            .map(|b| [b; 4])
            .find(|b| {
                arbitrary::Arbitrary::arbitrary_take_rest(arbitrary::Unstructured::new(b))
                    .is_ok_and(|input: fuzzing::PipelineInput| input.base == base)
            })
            .unwrap();
        write("pipeline", &format!("seed-base-{i}"), &bytes);
    }
    // dns_exchange: each query with its true answer, and with arbitrary bytes.
    for (name, data) in fuzzing::dns::exchange_seeds() {
        write("dns_exchange", &name, &data);
    }
    // dns_answer: a valid answer to each query.
    for (name, data) in fuzzing::dns::seeds() {
        write("dns_answer", &name, &data);
    }
    // hostile_strings: both clusters, no string.
    write("hostile_strings", "seed-conformance", &[0]);
    write("hostile_strings", "seed-quickstart", &[1]);

    // incremental_steps: pseudo-random inputs (a fixed xorshift, so reseeding is
    // reproducible) of 256 bytes to 4 KiB whose steps change the rendered ruleset at least
    // three times.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut kept = 0;
    while kept < 24 {
        let len = 256 << (next() % 5);
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if fuzzing::incremental(&data).len() >= 4 {
            write("incremental_steps", &format!("seed-{kept:02}"), &data);
            kept += 1;
        }
    }
}
