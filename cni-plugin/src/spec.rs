//! The CNI specification's wire types (spec 1.1.0, accepting 0.3.0 to 1.0.0): versions,
//! the error object and its codes, the network configuration flock-cni reads, and results in
//! the shape each version prints.
//!
//! Hand-rolled with serde (the surface is small): that keeps version down-conversion, both
//! GC keys and the error-on-stdout contract under our control.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Spec versions flock-cni speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest spec version.
pub const LATEST: &str = "1.1.0";

/// A spec version flock-cni supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl Version {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "0.3.0" => Self::V0_3_0,
            "0.3.1" => Self::V0_3_1,
            "0.4.0" => Self::V0_4_0,
            "1.0.0" => Self::V1_0_0,
            "1.1.0" => Self::V1_1_0,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// Results before 1.0.0 carry `"version": "4"|"6"` in each `ips` entry.
    pub fn ips_have_version(self) -> bool {
        self < Self::V1_0_0
    }

    /// 1.1.0 added `mtu` (and `socketPath`, `pciID`) to interfaces, and STATUS and GC.
    pub fn is_1_1(self) -> bool {
        self >= Self::V1_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error codes (spec §5 "Error", plus flock's own from 100).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// The pod's interface (or flock's host side of it) already exists.
    pub const INTERFACE_EXISTS: u32 = 100;
    /// Creating or configuring interfaces, addresses, routes or sysctls failed.
    pub const NETWORK_SETUP: u32 = 101;
    /// CHECK found the attachment not as ADD left it.
    pub const CHECK_FAILED: u32 = 102;
    /// A delegated plugin failed without a CNI error object.
    pub const DELEGATE_FAILED: u32 = 103;
    /// flock-cni's own state (attachment records, DEL spool) could not be written.
    pub const STATE: u32 = 104;
    /// A bug: flock-cni panicked (reported instead of crashing with nothing on stdout).
    pub const INTERNAL: u32 = 199;
}

/// The CNI error object. Printed on stdout (libcni reads errors from stdout) with a non-zero
/// exit status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The JSON printed on stdout.
    pub fn to_json(&self, version: &str) -> Value {
        let mut v = json!({"cniVersion": version, "code": self.code, "msg": self.msg});
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

/// An attachment named in GC's valid list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The network configuration flock-cni reads from stdin (one plugin of a conflist, as the
/// runtime derived it). Unknown keys are allowed: runtimes pass them through.
#[derive(Debug, Clone, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// `ipam` as written; its `type` names the delegate.
    #[serde(default)]
    pub ipam: Option<Value>,
    /// flock-agent's socket (default `/run/flock/cni.sock`).
    #[serde(rename = "agentSocket", default)]
    pub agent_socket: Option<PathBuf>,
    /// How long ADD waits for the agent's acknowledgement, in seconds (default 30).
    #[serde(rename = "agentTimeoutSeconds", default)]
    pub agent_timeout_seconds: Option<u64>,
    /// Where DELs wait while the agent is down (default `/run/flock/pending-del`).
    #[serde(rename = "pendingDelDir", default)]
    pub pending_del_dir: Option<PathBuf>,
    /// Where attachment records live (default `/var/lib/cni/flock`).
    #[serde(rename = "stateDir", default)]
    pub state_dir: Option<PathBuf>,
    /// MTU of both ends of the veth (default: the kernel's, 1500).
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Also log to this file (logs always go to stderr).
    #[serde(rename = "logFile", default)]
    pub log_file: Option<PathBuf>,
    /// `error`, `warn`, `info` (default) or `debug`.
    #[serde(rename = "logLevel", default)]
    pub log_level: Option<String>,
    /// flock was removed from this node: ADD fails, and the last pod's DEL removes what is
    /// left ([`crate::removal`]).
    #[serde(rename = "agentRemoved", default)]
    pub agent_removed: Option<crate::removal::Removed>,
    #[serde(default)]
    pub dns: Option<Value>,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    /// GC's valid attachments (spec key).
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// GC's valid attachments as libcni sends them (containernetworking/cni#1101).
    #[serde(rename = "cni.dev/attachments", default)]
    pub attachments: Option<Vec<Attachment>>,
}

impl NetConf {
    /// The delegated IPAM plugin's type, if IPAM is configured.
    pub fn ipam_type(&self) -> Result<Option<String>, CniError> {
        match &self.ipam {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => match m.get("type") {
                Some(Value::String(t)) if is_plugin_name(t) => Ok(Some(t.clone())),
                Some(Value::String(t)) => Err(CniError::new(code::INVALID_CONFIG, format!("ipam.type {t:?} is not a plugin name"))),
                _ => Err(CniError::new(code::INVALID_CONFIG, "ipam.type: missing or not a string")),
            },
            Some(_) => Err(CniError::new(code::INVALID_CONFIG, "ipam: must be an object")),
        }
    }

    /// GC's valid attachments under either key.
    pub fn gc_valid(&self) -> Option<Vec<Attachment>> {
        match (&self.valid_attachments, &self.attachments) {
            (Some(a), Some(b)) => Some(a.iter().chain(b).cloned().collect()),
            (Some(a), None) | (None, Some(a)) => Some(a.clone()),
            (None, None) => None,
        }
    }
}

/// A plugin binary name: no path separators or parent references.
fn is_plugin_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// Parses stdin into a [`NetConf`] and its [`Version`]: code 6 for bad JSON, 7 for a bad
/// config, 1 for an unsupported version.
pub fn parse_conf(stdin: &[u8]) -> Result<(NetConf, Version), CniError> {
    let value: Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::new(code::DECODE, "cannot decode the network configuration on stdin").with_details(e.to_string()))?;
    if !value.is_object() {
        return Err(CniError::new(code::DECODE, "the network configuration on stdin is not a JSON object"));
    }
    let conf: NetConf = serde_json::from_value(value)
        .map_err(|e| CniError::new(code::INVALID_CONFIG, "invalid network configuration").with_details(e.to_string()))?;
    let version = Version::parse(&conf.cni_version).ok_or_else(|| {
        CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
            .with_details(format!("config is {:?}, flock-cni supports {SUPPORTED_VERSIONS:?}", conf.cni_version))
    })?;
    if conf.name.is_empty() || !conf.name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err(CniError::new(code::INVALID_CONFIG, format!("name {:?} is not a valid network name", conf.name)));
    }
    if let Some(mtu) = conf.mtu
        && !(68..=65535).contains(&mtu)
    {
        return Err(CniError::new(code::INVALID_CONFIG, format!("mtu {mtu} is out of range (68-65535)")));
    }
    Ok((conf, version))
}

/// An interface in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    pub mtu: Option<u32>,
    pub sandbox: Option<String>,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with its prefix length (`198.18.1.11/32`).
    pub address: ipnet_lite::Cidr,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: ipnet_lite::Cidr,
    pub gw: Option<IpAddr>,
}

/// A result (ADD's output, `prevResult`, or a delegated IPAM's output), version-neutral.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Value,
}

impl CniResult {
    /// Reads a result of any supported version (the `version` field of old `ips` entries is
    /// checked against the address).
    pub fn parse(v: &Value) -> Result<Self, String> {
        let obj = v.as_object().ok_or("a result must be a JSON object")?;
        let mut r = CniResult { dns: obj.get("dns").cloned().unwrap_or(Value::Null), ..Default::default() };
        for (i, itf) in arr(obj, "interfaces")?.iter().enumerate() {
            let o = itf.as_object().ok_or(format!("interfaces[{i}]: not an object"))?;
            r.interfaces.push(Interface {
                name: str_field(o, "name").ok_or(format!("interfaces[{i}].name: missing"))?.to_string(),
                mac: str_field(o, "mac").unwrap_or_default().to_string(),
                mtu: o.get("mtu").and_then(Value::as_u64).and_then(|m| u32::try_from(m).ok()),
                sandbox: str_field(o, "sandbox").map(str::to_string),
            });
        }
        for (i, ip) in arr(obj, "ips")?.iter().enumerate() {
            let o = ip.as_object().ok_or(format!("ips[{i}]: not an object"))?;
            let address: ipnet_lite::Cidr = str_field(o, "address")
                .ok_or(format!("ips[{i}].address: missing"))?
                .parse()
                .map_err(|e| format!("ips[{i}].address: {e}"))?;
            if let Some(ver) = str_field(o, "version") {
                let want = if address.addr.is_ipv4() { "4" } else { "6" };
                if ver != want {
                    return Err(format!("ips[{i}].version: {ver:?} does not match address {address}"));
                }
            }
            let gateway = match str_field(o, "gateway") {
                None => None,
                Some(g) => Some(g.parse().map_err(|_| format!("ips[{i}].gateway: {g:?} is not an IP address"))?),
            };
            let interface = o.get("interface").and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
            r.ips.push(IpConfig { address, gateway, interface });
        }
        for (i, route) in arr(obj, "routes")?.iter().enumerate() {
            let o = route.as_object().ok_or(format!("routes[{i}]: not an object"))?;
            let dst =
                str_field(o, "dst").ok_or(format!("routes[{i}].dst: missing"))?.parse().map_err(|e| format!("routes[{i}].dst: {e}"))?;
            let gw = match str_field(o, "gw") {
                None => None,
                Some(g) => Some(g.parse().map_err(|_| format!("routes[{i}].gw: {g:?} is not an IP address"))?),
            };
            r.routes.push(Route { dst, gw });
        }
        Ok(r)
    }

    /// The result as `version` prints it.
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), Value::String(version.as_str().into()));
        if !self.interfaces.is_empty() {
            let itfs: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut o = Map::new();
                    o.insert("name".into(), i.name.clone().into());
                    if !i.mac.is_empty() {
                        o.insert("mac".into(), i.mac.clone().into());
                    }
                    if let (Some(mtu), true) = (i.mtu, version.is_1_1()) {
                        o.insert("mtu".into(), mtu.into());
                    }
                    if let Some(s) = &i.sandbox {
                        o.insert("sandbox".into(), s.clone().into());
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(itfs));
        }
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = Map::new();
                if version.ips_have_version() {
                    o.insert("version".into(), if ip.address.addr.is_ipv4() { "4" } else { "6" }.into());
                }
                if let Some(i) = ip.interface {
                    o.insert("interface".into(), i.into());
                }
                o.insert("address".into(), ip.address.to_string().into());
                if let Some(g) = ip.gateway {
                    o.insert("gateway".into(), g.to_string().into());
                }
                Value::Object(o)
            })
            .collect();
        out.insert("ips".into(), Value::Array(ips));
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self
                .routes
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("dst".into(), r.dst.to_string().into());
                    if let Some(g) = r.gw {
                        o.insert("gw".into(), g.to_string().into());
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("routes".into(), Value::Array(routes));
        }
        if !self.dns.is_null() {
            out.insert("dns".into(), self.dns.clone());
        }
        Value::Object(out)
    }
}

fn arr<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a [Value], String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(format!("{key}: not a list")),
    }
}

fn str_field<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    o.get(key).and_then(Value::as_str)
}

/// A minimal CIDR type (address + prefix length), keeping the address as written — CNI
/// results carry host addresses with their subnet's prefix (`198.18.3.2/24`), which a
/// network type would truncate.
pub mod ipnet_lite {
    use std::fmt;
    use std::net::IpAddr;
    use std::str::FromStr;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct Cidr {
        pub addr: IpAddr,
        pub prefix: u8,
    }

    impl Cidr {
        pub fn host(addr: IpAddr) -> Self {
            Self { addr, prefix: if addr.is_ipv4() { 32 } else { 128 } }
        }

        /// Whether `ip` is inside this prefix.
        pub fn contains(&self, ip: IpAddr) -> bool {
            match (self.addr, ip) {
                (IpAddr::V4(a), IpAddr::V4(b)) => {
                    let m = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                    u32::from(a) & m == u32::from(b) & m
                }
                (IpAddr::V6(a), IpAddr::V6(b)) => {
                    let m = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                    u128::from(a) & m == u128::from(b) & m
                }
                _ => false,
            }
        }
    }

    impl FromStr for Cidr {
        type Err = String;
        fn from_str(s: &str) -> Result<Self, String> {
            let (a, p) = s.split_once('/').ok_or_else(|| format!("{s:?} is not in CIDR notation"))?;
            let addr: IpAddr = a.parse().map_err(|_| format!("{a:?} is not an IP address"))?;
            let prefix: u8 = p.parse().map_err(|_| format!("{p:?} is not a prefix length"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(format!("prefix length {prefix} is out of range for {addr}"));
            }
            Ok(Self { addr, prefix })
        }
    }

    impl fmt::Display for Cidr {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_error_codes() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(Version::parse(v).unwrap().as_str(), v);
        }
        let e = parse_conf(br#"{"cniVersion":"0.2.0","name":"n","type":"flock-cni"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.details.contains("0.2.0"));
        assert_eq!(parse_conf(b"not json").unwrap_err().code, code::DECODE);
        assert_eq!(parse_conf(b"[1]").unwrap_err().code, code::DECODE);
        assert_eq!(parse_conf(br#"{"cniVersion":1}"#).unwrap_err().code, code::INVALID_CONFIG);
        assert_eq!(parse_conf(br#"{"cniVersion":"1.0.0","name":"bad name"}"#).unwrap_err().code, code::INVALID_CONFIG);
        assert_eq!(parse_conf(br#"{"cniVersion":"1.0.0","name":"n","mtu":10}"#).unwrap_err().code, code::INVALID_CONFIG);
        let (c, v) =
            parse_conf(br#"{"cniVersion":"1.0.0","name":"n","type":"flock-cni","ipam":{"type":"host-local"},"extra":{"x":1}}"#).unwrap();
        assert_eq!(v, Version::V1_0_0);
        assert_eq!(c.ipam_type().unwrap().as_deref(), Some("host-local"));
    }

    #[test]
    fn ipam_type_must_be_a_plugin_name() {
        for bad in [r#"{"type":"../../bin/sh"}"#, r#"{"type":""}"#, r#"{}"#, r#"[]"#] {
            let c: NetConf = serde_json::from_str(&format!(r#"{{"cniVersion":"1.0.0","ipam":{bad}}}"#)).unwrap();
            assert_eq!(c.ipam_type().unwrap_err().code, code::INVALID_CONFIG, "{bad}");
        }
    }

    #[test]
    fn both_gc_keys_are_read() {
        let c: NetConf = serde_json::from_str(
            r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"cni.dev/attachments":[{"containerID":"b","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.gc_valid().unwrap().len(), 2);
        let c: NetConf =
            serde_json::from_str(r#"{"cniVersion":"1.1.0","cni.dev/attachments":[{"containerID":"b","ifname":"eth0"}]}"#).unwrap();
        assert_eq!(c.gc_valid().unwrap()[0].container_id, "b");
        let c: NetConf = serde_json::from_str(r#"{"cniVersion":"1.1.0"}"#).unwrap();
        assert!(c.gc_valid().is_none());
    }

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface { name: "flk0123456789ab".into(), mac: "aa:bb:cc:dd:ee:ff".into(), mtu: Some(1450), sandbox: None },
                Interface { name: "eth0".into(), mac: "11:22:33:44:55:66".into(), mtu: Some(1450), sandbox: Some("/run/netns/p".into()) },
            ],
            ips: vec![
                IpConfig { address: "198.18.1.11/32".parse().unwrap(), gateway: Some("169.254.1.1".parse().unwrap()), interface: Some(1) },
                IpConfig { address: "2001:db8::11/128".parse().unwrap(), gateway: Some("fe80::1".parse().unwrap()), interface: Some(1) },
            ],
            routes: vec![Route { dst: "0.0.0.0/0".parse().unwrap(), gw: Some("169.254.1.1".parse().unwrap()) }],
            dns: Value::Null,
        }
    }

    #[test]
    fn results_print_in_the_requested_version() {
        let r = sample();
        let v1 = r.to_json(Version::V1_1_0);
        assert_eq!(v1["cniVersion"], "1.1.0");
        assert_eq!(v1["interfaces"][1]["mtu"], 1450);
        assert!(v1["ips"][0].get("version").is_none());
        let v10 = r.to_json(Version::V1_0_0);
        assert!(v10["interfaces"][1].get("mtu").is_none());
        let v031 = r.to_json(Version::V0_3_1);
        assert_eq!(v031["ips"][0]["version"], "4");
        assert_eq!(v031["ips"][1]["version"], "6");
        assert_eq!(v031["ips"][1]["interface"], 1);
        // Every version parses back to the same result (mtu only survives in 1.1).
        for v in [Version::V0_3_0, Version::V0_4_0, Version::V1_0_0] {
            let mut back = CniResult::parse(&r.to_json(v)).unwrap();
            for i in &mut back.interfaces {
                i.mtu = Some(1450);
            }
            assert_eq!(back, r, "{v}");
        }
        assert_eq!(CniResult::parse(&v1).unwrap(), r);
    }

    #[test]
    fn prev_results_are_validated() {
        let bad = serde_json::json!({"ips": [{"version": "6", "address": "198.18.1.1/32"}]});
        assert!(CniResult::parse(&bad).unwrap_err().contains("does not match"));
        let bad = serde_json::json!({"ips": [{"address": "198.18.1.1"}]});
        assert!(CniResult::parse(&bad).is_err());
        let ipam = serde_json::json!({"cniVersion": "1.0.0", "ips": [{"address": "198.18.3.2/24", "gateway": "198.18.3.1"}], "dns": {}});
        let r = CniResult::parse(&ipam).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "198.18.3.2/24");
        assert!(r.interfaces.is_empty());
    }

    #[test]
    fn error_json_has_version_code_msg_details() {
        let e = CniError::new(code::INVALID_ENV, "required environment variables missing").with_details("CNI_NETNS");
        let j = e.to_json("1.0.0");
        assert_eq!(
            j,
            serde_json::json!({"cniVersion":"1.0.0","code":4,"msg":"required environment variables missing","details":"CNI_NETNS"})
        );
        assert!(CniError::new(1, "x").to_json("1.1.0").get("details").is_none());
    }
}
