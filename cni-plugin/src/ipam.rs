//! IPAM by delegation (spec §4): the plugin named by `ipam.type` is found in `CNI_PATH`
//! and executed with the same stdin and environment (only `CNI_COMMAND` set for the verb).
//! Its stderr goes to ours; its stdout is its result or its error object, which is passed
//! on unchanged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::spec::{CniError, code};

/// Finds `plugin` in the `CNI_PATH` directories.
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    if path.is_empty() {
        return Err(
            CniError::new(code::INVALID_ENV, format!("CNI_PATH is required to run the ipam plugin {plugin:?}")).with_details("CNI_PATH")
        );
    }
    path.iter().map(|d| d.join(plugin)).find(|p| p.is_file()).ok_or_else(|| {
        let dirs: Vec<String> = path.iter().map(|d| d.display().to_string()).collect();
        CniError::new(code::INVALID_CONFIG, format!("ipam plugin {plugin:?} not found in CNI_PATH")).with_details(dirs.join(":"))
    })
}

/// Runs `plugin` for `verb` with `stdin`, our environment, and `overrides` on top.
/// `Ok(None)` when it printed nothing (DEL, CHECK, GC, STATUS success).
pub fn exec(plugin: &Path, verb: &str, stdin: &[u8], overrides: &[(&str, &str)]) -> Result<Option<Value>, CniError> {
    let name = plugin.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let mut cmd = Command::new(plugin);
    cmd.env("CNI_COMMAND", verb).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    for (k, v) in overrides {
        cmd.env(k, v);
    }
    let io_err =
        |what: &str, e: std::io::Error| CniError::new(code::IO, format!("{what} the ipam plugin {name}")).with_details(e.to_string());
    let mut child = cmd.spawn().map_err(|e| io_err("cannot run", e))?;
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin may exit without reading all of stdin; that is its business.
        let _ = pipe.write_all(stdin);
    }
    let out = child.wait_with_output().map_err(|e| io_err("cannot wait for", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        if stdout.trim().is_empty() {
            return Ok(None);
        }
        return serde_json::from_str(&stdout).map(Some).map_err(|e| {
            CniError::new(code::DELEGATE_FAILED, format!("the ipam plugin {name} printed an invalid result")).with_details(e.to_string())
        });
    }
    match serde_json::from_str::<CniError>(&stdout) {
        Ok(mut e) => {
            e.msg = format!("{name}: {}", e.msg);
            Err(e)
        }
        Err(_) => Err(CniError::new(code::DELEGATE_FAILED, format!("the ipam plugin {name} failed ({})", out.status))
            .with_details(stdout.chars().take(500).collect::<String>())),
    }
}

/// Whether `plugin` supports spec `version`, by its VERSION answer (delegates of older
/// specs cannot take STATUS or GC).
pub fn supports(plugin: &Path, version: &str) -> bool {
    let stdin = format!(r#"{{"cniVersion":"{version}"}}"#);
    match exec(plugin, "VERSION", stdin.as_bytes(), &[]) {
        Ok(Some(v)) => v.get("supportedVersions").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x.as_str() == Some(version))),
        _ => false,
    }
}
