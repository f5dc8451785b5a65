//! The translator and renderer are pure (no I/O, clock, process, randomness, async runtime or
//! hash-order iteration): this test keeps them that way by refusing the paths that would
//! bring those in.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

const FORBIDDEN: &[&str] = &[
    "tokio",
    "kube",
    "rtnetlink",
    "netlink",
    "std::process",
    "std::fs",
    "std::net::Tcp",
    "std::net::Udp",
    "std::time",
    "Instant",
    "SystemTime",
    "std::thread",
    "std::env",
    "HashMap",
    "HashSet",
    "rand::",
    "crate::apply",
    "crate::netns",
];

#[test]
fn translate_and_render_are_pure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for dir in ["translate", "render"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            // Test modules may use what they like.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code = if path.file_name().is_some_and(|n| n == "tests.rs") { "" } else { code };
            for (i, line) in code.lines().enumerate() {
                let l = line.trim_start();
                if l.starts_with("//") {
                    continue;
                }
                for f in FORBIDDEN {
                    assert!(!l.contains(f), "{}:{}: the pure stages may not use {f}: {line}", path.display(), i + 1);
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "checked only {checked} files");
}
