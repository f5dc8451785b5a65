//! Build metadata for `flock::process::COMMIT`: the environment variable `FLOCK_COMMIT`
//! when it is set (the image build passes it as a build argument: `.git` is not in its
//! context), else `git rev-parse --short HEAD` when this is a git checkout, else `unknown`.
//! Only a plain token (letters, digits, `.`, `_`, `-`; at most 40) is taken.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=FLOCK_COMMIT");
    let given = std::env::var("FLOCK_COMMIT").ok().filter(|c| !c.trim().is_empty());
    let commit = given.or_else(git_commit).and_then(|c| token(c.trim())).unwrap_or_else(|| "unknown".to_string());
    println!("cargo::rustc-env=FLOCK_COMMIT={commit}");
}

fn token(s: &str) -> Option<String> {
    let ok = !s.is_empty() && s.len() <= 40 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    ok.then(|| s.to_string())
}

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default()
}

/// `git ARGS` in the package's directory, its trimmed output when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(manifest_dir()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The short commit of HEAD; asks cargo to build again when HEAD moves (a commit, a
/// checkout): HEAD itself, the branch it points to, and the packed refs. In a worktree
/// `.git` is a file, so the paths come from git.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            let p = Path::new(&p);
            let p = if p.is_absolute() { p.to_path_buf() } else { manifest_dir().join(p) };
            // A path that does not exist would make cargo run this script on every build.
            if p.exists() {
                println!("cargo::rerun-if-changed={}", p.display());
            }
        }
    }
    Some(commit)
}
