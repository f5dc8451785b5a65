//! The CNI execution environment (spec §2): `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`, validated per verb. Every problem is code 4 naming
//! the variable.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::spec::{CniError, code};

/// The operation requested by the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Verb {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            "VERSION" => Self::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Status => "STATUS",
            Self::Gc => "GC",
            Self::Version => "VERSION",
        }
    }
}

/// Pod identity and requests from `CNI_ARGS` (containerd/CRI-O conventions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub infra_container_id: Option<String>,
    /// `IP=`: an address requested from IPAM (passed through: IPAM reads `CNI_ARGS` itself).
    pub ip: Option<String>,
    /// Everything else, when `IgnoreUnknown` allowed it.
    pub other: BTreeMap<String, String>,
}

/// Parses `K=V;K=V`. Unknown keys are an error (code 2) unless `IgnoreUnknown` is true.
pub fn parse_args(s: &str) -> Result<CniArgs, CniError> {
    let mut args = CniArgs::default();
    let mut ignore_unknown = false;
    let mut unknown = Vec::new();
    for pair in s.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CniError::new(code::INVALID_ENV, "invalid CNI_ARGS").with_details(format!("{pair:?} is not KEY=VALUE")))?;
        match k {
            "IgnoreUnknown" => ignore_unknown = matches!(v.to_ascii_lowercase().as_str(), "1" | "true"),
            "K8S_POD_NAMESPACE" => args.pod_namespace = Some(v.to_string()),
            "K8S_POD_NAME" => args.pod_name = Some(v.to_string()),
            "K8S_POD_UID" => args.pod_uid = Some(v.to_string()),
            "K8S_POD_INFRA_CONTAINER_ID" => args.infra_container_id = Some(v.to_string()),
            "IP" => args.ip = Some(v.to_string()),
            _ => {
                unknown.push(k.to_string());
                args.other.insert(k.to_string(), v.to_string());
            }
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::new(code::UNSUPPORTED_FIELD, format!("unknown CNI_ARGS keys: {}", unknown.join(", ")))
            .with_details("set IgnoreUnknown=1 to ignore them"));
    }
    Ok(args)
}

/// The validated environment of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub verb: Verb,
    pub container_id: String,
    /// Empty for DEL without a netns, STATUS, GC and VERSION.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
    /// `CNI_ARGS` as given, for delegates.
    pub raw_args: String,
}

/// Reads the environment through `get` (so tests need no process environment).
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
    let value = |k: &str| get(k).filter(|v| !v.is_empty());
    let command = value("CNI_COMMAND").ok_or_else(|| missing(&["CNI_COMMAND"]))?;
    let verb = Verb::parse(&command)
        .ok_or_else(|| CniError::new(code::INVALID_ENV, format!("unknown CNI_COMMAND {command:?}")).with_details("CNI_COMMAND"))?;
    let required: &[&str] = match verb {
        Verb::Add | Verb::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        Verb::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
        Verb::Gc => &["CNI_PATH"],
        Verb::Status | Verb::Version => &[],
    };
    let absent: Vec<&str> = required.iter().copied().filter(|k| value(k).is_none()).collect();
    if !absent.is_empty() {
        return Err(missing(&absent));
    }
    let container_id = value("CNI_CONTAINERID").unwrap_or_default();
    if !container_id.is_empty() && !valid_container_id(&container_id) {
        return Err(CniError::new(code::INVALID_ENV, "invalid CNI_CONTAINERID")
            .with_details(format!("{container_id:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")));
    }
    let ifname = value("CNI_IFNAME").unwrap_or_default();
    if !ifname.is_empty()
        && let Err(why) = validate_ifname(&ifname)
    {
        return Err(CniError::new(code::INVALID_ENV, "invalid CNI_IFNAME").with_details(format!("{ifname:?}: {why}")));
    }
    let raw_args = get("CNI_ARGS").unwrap_or_default();
    let args = parse_args(&raw_args)?;
    let path = value("CNI_PATH").map(|p| std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()).collect()).unwrap_or_default();
    Ok(Env { verb, container_id, netns: value("CNI_NETNS").map(PathBuf::from), ifname, args, path, raw_args })
}

fn missing(vars: &[&str]) -> CniError {
    CniError::new(code::INVALID_ENV, "required environment variables missing").with_details(vars.join(", "))
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`
pub fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric()) && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// An interface name the kernel accepts: 1 to 15 bytes, not `.` or `..`, no `/`, `:` or
/// whitespace.
pub fn validate_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 15 {
        return Err("must be 1 to 15 bytes");
    }
    if name == "." || name == ".." {
        return Err("must not be . or ..");
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control()) {
        return Err("must not contain '/', ':' or whitespace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let m: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_vars(|k| m.get(k).cloned())
    }

    const FULL: &[(&str, &str)] =
        &[("CNI_CONTAINERID", "c1"), ("CNI_NETNS", "/run/netns/p"), ("CNI_IFNAME", "eth0"), ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni")];

    fn with(verb: &str, drop: &[&str]) -> Result<Env, CniError> {
        let mut v: Vec<(&str, &str)> = FULL.iter().filter(|(k, _)| !drop.contains(k)).copied().collect();
        v.push(("CNI_COMMAND", verb));
        env(&v)
    }

    #[test]
    fn required_variables_per_verb() {
        // (verb, variable removed, expected failure)
        let matrix: &[(&str, &str, bool)] = &[
            ("ADD", "CNI_CONTAINERID", true),
            ("ADD", "CNI_NETNS", true),
            ("ADD", "CNI_IFNAME", true),
            ("ADD", "CNI_PATH", false),
            ("CHECK", "CNI_NETNS", true),
            ("CHECK", "CNI_IFNAME", true),
            ("DEL", "CNI_NETNS", false),
            ("DEL", "CNI_CONTAINERID", true),
            ("DEL", "CNI_IFNAME", true),
            ("GC", "CNI_PATH", true),
            ("GC", "CNI_CONTAINERID", false),
            ("STATUS", "CNI_CONTAINERID", false),
            ("STATUS", "CNI_PATH", false),
            ("VERSION", "CNI_NETNS", false),
        ];
        for (verb, var, fails) in matrix {
            let r = with(verb, &[var]);
            match (r, fails) {
                (Err(e), true) => {
                    assert_eq!(e.code, code::INVALID_ENV, "{verb} without {var}");
                    assert!(e.details.contains(var), "{verb} without {var}: {e}");
                }
                (Ok(_), false) => {}
                (r, _) => panic!("{verb} without {var}: {r:?}"),
            }
        }
        let e = env(&[]).unwrap_err();
        assert!(e.details.contains("CNI_COMMAND"));
        let e = env(&[("CNI_COMMAND", "ADDD")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
    }

    #[test]
    fn container_id_and_ifname_rules() {
        let mut v = FULL.to_vec();
        v.push(("CNI_COMMAND", "ADD"));
        for (var, bad) in [
            ("CNI_CONTAINERID", "-x"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "a/b"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "a b"),
            ("CNI_IFNAME", "abcdefghijklmnop"),
            ("CNI_IFNAME", "a:b"),
        ] {
            let vv: Vec<(&str, &str)> = v.iter().map(|(k, val)| if *k == var { (*k, bad) } else { (*k, *val) }).collect();
            let e = env(&vv).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{var}={bad}");
            assert!(e.msg.contains(var), "{var}={bad}: {e}");
        }
    }

    #[test]
    fn cni_args_containerd_style() {
        let a = parse_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;IP=198.18.1.5;Other=1",
        )
        .unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("x"));
        assert_eq!(a.pod_name.as_deref(), Some("a"));
        assert_eq!(a.pod_uid.as_deref(), Some("u-1"));
        assert_eq!(a.infra_container_id.as_deref(), Some("abc"));
        assert_eq!(a.ip.as_deref(), Some("198.18.1.5"));
        assert_eq!(a.other.get("Other").map(String::as_str), Some("1"));
        let e = parse_args("K8S_POD_NAME=a;Other=1").unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("Other"));
        assert!(parse_args("IgnoreUnknown=true;Other=1").is_ok());
        assert_eq!(parse_args("novalue").unwrap_err().code, code::INVALID_ENV);
        assert_eq!(parse_args("").unwrap(), CniArgs::default());
        // A value may contain '='.
        assert_eq!(parse_args("IgnoreUnknown=1;X=a=b").unwrap().other["X"], "a=b");
    }
}
