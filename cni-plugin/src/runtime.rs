//! A minimal CNI runtime: what libcni does for containerd, following the spec's chaining
//! rules (SPEC §3): plugins of a conflist run in order for ADD and CHECK and in reverse for
//! DEL; each gets the list's `cniVersion` and `name`, `runtimeConfig` with the capabilities
//! it declared and the runtime supplied, and the previous plugin's result as `prevResult`;
//! `capabilities` is removed. Used by flock's tests and by `flockctl sim`, which run
//! flock-cni exactly as kubelet's runtime would — no cnitool exists on Debian.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Map, Value};

use crate::netns::{self, Netns};
use crate::spec::{Attachment, CniError, code};

/// A network configuration list (`*.conflist`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfList {
    pub cni_version: String,
    pub name: String,
    pub plugins: Vec<Map<String, Value>>,
}

impl ConfList {
    /// Parses a conflist's JSON.
    pub fn parse(text: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let o = v.as_object().ok_or("a conflist is a JSON object")?;
        let s = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string).ok_or(format!("{k}: missing or not a string"));
        let plugins = o
            .get("plugins")
            .and_then(Value::as_array)
            .ok_or("plugins: missing or not a list")?
            .iter()
            .enumerate()
            .map(|(i, p)| match p.as_object() {
                Some(m) if m.get("type").and_then(Value::as_str).is_some() => Ok(m.clone()),
                _ => Err(format!("plugins[{i}]: an object with a type")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { cni_version: s("cniVersion")?, name: s("name")?, plugins })
    }

    /// Reads a conflist file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// One attachment as the runtime knows it.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    pub container_id: String,
    /// The pod's namespace path; empty when it is gone (DEL).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` pairs.
    pub args: Vec<(String, String)>,
    /// Capability arguments offered to plugins that declare them (e.g. `ips`).
    pub capability_args: Map<String, Value>,
}

impl Sandbox {
    /// A pod's sandbox as kubelet's runtime describes it: interface `eth0` in the network
    /// namespace at `netns`, `CNI_ARGS` naming the pod (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
    /// `K8S_POD_INFRA_CONTAINER_ID`, and `K8S_POD_UID` when known) with `IgnoreUnknown=1`.
    pub fn for_pod(container_id: &str, netns: &str, namespace: &str, name: &str, uid: Option<&str>) -> Self {
        let mut args = vec![
            ("IgnoreUnknown".to_string(), "1".to_string()),
            ("K8S_POD_NAMESPACE".to_string(), namespace.to_string()),
            ("K8S_POD_NAME".to_string(), name.to_string()),
            ("K8S_POD_INFRA_CONTAINER_ID".to_string(), container_id.to_string()),
        ];
        if let Some(uid) = uid {
            args.push(("K8S_POD_UID".to_string(), uid.to_string()));
        }
        Self { container_id: container_id.into(), netns: netns.into(), ifname: "eth0".into(), args, capability_args: Map::new() }
    }
}

/// Runs plugins from `cni_path`, in network namespace `netns` (the node's).
#[derive(Debug, Clone)]
pub struct Runtime {
    pub cni_path: Vec<PathBuf>,
    pub netns: Netns,
}

impl Runtime {
    /// ADD through the whole list; the final result.
    pub fn add(&self, conf: &ConfList, sb: &Sandbox) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for p in &conf.plugins {
            let out = self.exec(conf, p, "ADD", sb, prev.as_ref())?;
            prev = Some(out.ok_or_else(|| CniError::new(code::DECODE, format!("{}: ADD printed no result", type_of(p))))?);
        }
        prev.ok_or_else(|| CniError::new(code::INVALID_CONFIG, "the conflist has no plugins"))
    }

    /// DEL through the list in reverse, with the cached ADD result (if any).
    pub fn del(&self, conf: &ConfList, sb: &Sandbox, prev: Option<&Value>) -> Result<(), CniError> {
        for p in conf.plugins.iter().rev() {
            self.exec(conf, p, "DEL", sb, prev)?;
        }
        Ok(())
    }

    /// CHECK through the list, with the cached ADD result.
    pub fn check(&self, conf: &ConfList, sb: &Sandbox, prev: &Value) -> Result<(), CniError> {
        for p in &conf.plugins {
            self.exec(conf, p, "CHECK", sb, Some(prev))?;
        }
        Ok(())
    }

    /// STATUS of every plugin.
    pub fn status(&self, conf: &ConfList) -> Result<(), CniError> {
        for p in &conf.plugins {
            self.exec(conf, p, "STATUS", &Sandbox::default(), None)?;
        }
        Ok(())
    }

    /// GC with the attachments still valid.
    pub fn gc(&self, conf: &ConfList, valid: &[Attachment]) -> Result<(), CniError> {
        for p in &conf.plugins {
            let mut p = p.clone();
            let list = serde_json::to_value(valid).map_err(|e| CniError::new(code::IO, e.to_string()))?;
            p.insert("cni.dev/valid-attachments".into(), list);
            self.exec(conf, &p, "GC", &Sandbox::default(), None)?;
        }
        Ok(())
    }

    fn exec(
        &self,
        conf: &ConfList,
        plugin: &Map<String, Value>,
        verb: &str,
        sb: &Sandbox,
        prev: Option<&Value>,
    ) -> Result<Option<Value>, CniError> {
        let ty = type_of(plugin);
        let bin = self
            .cni_path
            .iter()
            .map(|d| d.join(&ty))
            .find(|p| p.is_file())
            .ok_or_else(|| CniError::new(code::INVALID_CONFIG, format!("plugin {ty:?} not found in CNI_PATH")))?;
        let mut cfg = plugin.clone();
        let declared: Vec<String> = cfg
            .remove("capabilities")
            .and_then(|c| c.as_object().cloned())
            .map(|m| m.into_iter().filter(|(_, v)| v.as_bool() == Some(true)).map(|(k, _)| k).collect())
            .unwrap_or_default();
        cfg.insert("cniVersion".into(), Value::String(conf.cni_version.clone()));
        cfg.insert("name".into(), Value::String(conf.name.clone()));
        let rc: Map<String, Value> = declared.iter().filter_map(|k| sb.capability_args.get(k).map(|v| (k.clone(), v.clone()))).collect();
        if !rc.is_empty() && verb != "GC" && verb != "STATUS" {
            cfg.insert("runtimeConfig".into(), Value::Object(rc));
        }
        if let Some(p) = prev {
            cfg.insert("prevResult".into(), p.clone());
        }
        let stdin = serde_json::to_vec(&Value::Object(cfg)).map_err(|e| CniError::new(code::IO, e.to_string()))?;
        let args: Vec<String> = sb.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let path = std::env::join_paths(&self.cni_path).map_err(|e| CniError::new(code::INVALID_ENV, e.to_string()))?;
        let env: Vec<(&str, String)> = vec![
            ("CNI_COMMAND", verb.to_string()),
            ("CNI_CONTAINERID", sb.container_id.clone()),
            ("CNI_NETNS", sb.netns.clone()),
            ("CNI_IFNAME", sb.ifname.clone()),
            ("CNI_ARGS", args.join(";")),
            ("CNI_PATH", path.to_string_lossy().to_string()),
        ];
        let out = netns::run_in(&self.netns, || -> std::io::Result<std::process::Output> {
            let mut cmd = Command::new(&bin);
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            for (k, v) in &env {
                if v.is_empty() {
                    cmd.env_remove(k)
                } else {
                    cmd.env(k, v)
                };
            }
            let mut child = cmd.spawn()?;
            if let Some(mut i) = child.stdin.take() {
                let _ = i.write_all(&stdin);
            }
            child.wait_with_output()
        })
        .map_err(|e| CniError::new(code::IO, e.to_string()))?
        .map_err(|e| CniError::new(code::IO, format!("running {}: {e}", bin.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            if stdout.trim().is_empty() {
                return Ok(None);
            }
            return serde_json::from_str(&stdout)
                .map(Some)
                .map_err(|e| CniError::new(code::DECODE, format!("{ty} {verb}: invalid output: {e}")));
        }
        match serde_json::from_str::<CniError>(&stdout) {
            Ok(mut e) => {
                e.msg = format!("{ty} {verb}: {}", e.msg);
                Err(e)
            }
            Err(_) => Err(CniError::new(code::IO, format!("{ty} {verb} failed ({})", out.status)).with_details(format!(
                "stdout: {} stderr: {}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

fn type_of(p: &Map<String, Value>) -> String {
    p.get("type").and_then(Value::as_str).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_parsing() {
        let c = ConfList::parse(
            r#"{"cniVersion":"1.0.0","name":"flock","plugins":[{"type":"loopback"},{"type":"flock-cni","ipam":{"type":"host-local"}}]}"#,
        )
        .unwrap();
        assert_eq!(c.plugins.len(), 2);
        assert!(ConfList::parse(r#"{"cniVersion":"1.0.0","name":"x","plugins":[{}]}"#).unwrap_err().contains("plugins[0]"));
        assert!(ConfList::parse(r#"{"name":"x","plugins":[]}"#).unwrap_err().contains("cniVersion"));
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn the_shipped_conflist_is_valid_for_flock_cni() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/cni/10-flock.conflist");
        let list = ConfList::load(&path).unwrap();
        // While the chain delegates to Debian's plugins (spec <= 1.0.0), it says 1.0.0.
        assert_eq!(list.cni_version, "1.0.0");
        let mut flock = list.plugins.iter().find(|p| p.get("type").and_then(Value::as_str) == Some("flock-cni")).unwrap().clone();
        flock.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
        flock.insert("name".into(), Value::String(list.name.clone()));
        let (conf, _) = crate::spec::parse_conf(&serde_json::to_vec(&Value::Object(flock)).unwrap()).unwrap();
        assert_eq!(conf.ipam_type().unwrap().as_deref(), Some("host-local"));
        assert_eq!(conf.agent_socket.as_deref(), Some(Path::new(crate::protocol::DEFAULT_SOCKET)));
    }
}
