//! The file edge: manifests and conformance cases read from disk, for the static source,
//! flockctl and the tests. What a file's text means is the pure parsers' business
//! ([`crate::model::manifest::parse_str`], [`crate::conformance::parse_case`]); here are
//! the reads, the directory walks and the errors that name the file. Cases are flockctl's
//! (the `tool` feature).

use std::path::{Path, PathBuf};

#[cfg(feature = "tool")]
use crate::conformance::{self, Case, CaseError};
use crate::model::manifest::{self, ManifestError, Manifests};

/// Why files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[cfg(feature = "tool")]
    #[error(transparent)]
    Case(#[from] CaseError),
    #[error("{path}: no case.yaml here or in its folders")]
    NoCases { path: PathBuf },
}

fn read(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|error| FileError::Read { path: path.to_path_buf(), error })
}

/// Reads every manifest under `paths` (files, or directories walked recursively: their
/// `.yaml`, `.yml` and `.json` files in name order).
pub fn load_manifests(paths: &[PathBuf]) -> Result<Manifests, FileError> {
    let mut out = Manifests::default();
    for path in paths {
        for file in manifest_files(path)? {
            let parsed = manifest::parse_str(&file, &read(&file)?)?;
            out.objects.extend(parsed.objects);
            out.warnings.extend(parsed.warnings);
        }
    }
    Ok(out)
}

fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, FileError> {
    let unreadable = |error| FileError::Read { path: path.to_path_buf(), error };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(path).map_err(unreadable)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().map_err(unreadable)?;
    entries.sort();
    let mut files = Vec::new();
    for entry in entries {
        if entry.is_dir() {
            files.extend(manifest_files(&entry)?);
        } else if matches!(entry.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
            files.push(entry);
        }
    }
    Ok(files)
}

#[cfg(feature = "tool")]
/// Case folders under `dirs`: each dir is a case (has `case.yaml`) or holds case folders.
pub fn find_cases(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, FileError> {
    let mut out = Vec::new();
    for d in dirs {
        if d.join("case.yaml").is_file() {
            out.push(d.clone());
            continue;
        }
        let entries = std::fs::read_dir(d).map_err(|error| FileError::Read { path: d.clone(), error })?;
        let mut sub: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("case.yaml").is_file()).collect();
        sub.sort();
        if sub.is_empty() {
            return Err(FileError::NoCases { path: d.clone() });
        }
        out.extend(sub);
    }
    Ok(out)
}

#[cfg(feature = "tool")]
/// The ClusterNetworkPolicy cases to run on the IPv6 base (`tests/conformance-v6/`): that
/// folder's own (IPv6 copies of the cases that write IPv4 addresses, the domain cases
/// among them) and every case of `v4_root` that applies a ClusterNetworkPolicy and writes no
/// IPv4 address, as is.
pub fn ipv6_cluster_policy_cases(v4_root: &Path, v6_root: &Path) -> Result<Vec<PathBuf>, FileError> {
    let mut out = Vec::new();
    for dir in find_cases(&[v4_root.to_path_buf()])? {
        let text = read(&dir.join("case.yaml"))?;
        let ipv4 = text.split(|c: char| !(c.is_ascii_digit() || c == '.')).any(|w| w.parse::<std::net::Ipv4Addr>().is_ok());
        if text.contains("kind: ClusterNetworkPolicy") && !ipv4 {
            out.push(dir);
        }
    }
    out.extend(find_cases(&[v6_root.to_path_buf()])?);
    Ok(out)
}

#[cfg(feature = "tool")]
/// Reads `<dir>/case.yaml`.
pub fn load_case(dir: &Path) -> Result<Case, FileError> {
    let path = dir.join("case.yaml");
    let text = read(&path)?;
    let dir_name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    Ok(conformance::parse_case(&path, &dir_name, &text)?)
}
