//! The host-side interface name of a pod attachment (design.md §3), and the pod side's MAC
//! and link-local address derived from it.
//!
//! `flk` + the first 12 hex digits of SHA-256 of `"<container id>/<ifname>"`: 15 bytes, the
//! longest name Linux accepts (IFNAMSIZ - 1). It is derived only from what the runtime passes
//! on every CNI call, so DEL without `prevResult` or netns, GC, and the agent (which programs
//! nftables before the veth exists) all find the same name. Pod names are deliberately not
//! used: a new sandbox of the same pod must get a new interface.

use sha2::{Digest, Sha256};

/// Prefix of every host-side pod interface flock creates; the ruleset drops traffic of
/// `flk*` interfaces it has not programmed.
pub const HOST_INTERFACE_PREFIX: &str = "flk";

/// Number of hex digits of the hash kept in the name.
const HASH_HEX_DIGITS: usize = 12;

/// The host-side interface name for `(container_id, ifname)`.
///
/// ```
/// let name = flock_cni::host_interface_name("0123abcd", "eth0");
/// assert_eq!(name.len(), 15);
/// assert!(name.starts_with("flk"));
/// ```
pub fn host_interface_name(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::new().chain_update(container_id.as_bytes()).chain_update(b"/").chain_update(ifname.as_bytes()).finalize();
    let mut name = String::with_capacity(HOST_INTERFACE_PREFIX.len() + HASH_HEX_DIGITS);
    name.push_str(HOST_INTERFACE_PREFIX);
    for byte in digest.iter().take(HASH_HEX_DIGITS / 2) {
        name.push(hex_digit(byte >> 4));
        name.push(hex_digit(byte & 0x0f));
    }
    name
}

/// The pod side's MAC: the 48 bits of hash in the host interface's name (unique per
/// attachment, as the name is), made unicast and locally administered.
pub fn pod_mac(host_if: &str) -> [u8; 6] {
    let hex = host_if.strip_prefix(HOST_INTERFACE_PREFIX).unwrap_or(host_if).as_bytes();
    let mut mac = [0u8; 6];
    for (i, byte) in mac.iter_mut().enumerate() {
        let digit = |j: usize| hex.get(j).and_then(|c| (*c as char).to_digit(16)).unwrap_or(0) as u8;
        *byte = (digit(2 * i) << 4) | digit(2 * i + 1);
    }
    mac[0] = (mac[0] & 0xfc) | 0x02;
    mac
}

/// The modified EUI-64 link-local address of `mac` (RFC 4291), as the kernel would make it.
pub fn eui64_link_local(mac: [u8; 6]) -> std::net::Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    std::net::Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 0x02, b, c, 0xff, 0xfe, d, e, f])
}

/// The link-local address flock-cni gives the pod side of host interface `host_if` (the
/// EUI-64 of [`pod_mac`]): the only link-local source flock's ruleset accepts neighbour
/// discovery from on that interface.
pub fn pod_link_local(host_if: &str) -> std::net::Ipv6Addr {
    eui64_link_local(pod_mac(host_if))
}

/// Whether `name` has the exact shape [`host_interface_name`] produces (`flk` + 12 lowercase
/// hex digits). The agent refuses any other name from the socket, so nothing but this shape
/// can reach an nft script as an interface name.
pub fn is_host_interface_name(name: &str) -> bool {
    name.len() == HOST_INTERFACE_PREFIX.len() + HASH_HEX_DIGITS
        && name.starts_with(HOST_INTERFACE_PREFIX)
        && name[HOST_INTERFACE_PREFIX.len()..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(nibble & 0x0f)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_is_flk_and_twelve_hex_digits_of_sha256() {
        // Computed independently: printf 'abc/eth0' | sha256sum → 538f587a2365…
        let name = host_interface_name("abc", "eth0");
        assert_eq!(name, "flk538f587a2365");
        assert!(is_host_interface_name(&name));
    }

    #[test]
    fn name_fits_ifnamsiz_and_is_deterministic() {
        for cid in ["", "a", &"x".repeat(300)] {
            for ifname in ["eth0", "net1", ""] {
                let a = host_interface_name(cid, ifname);
                assert_eq!(a.len(), 15, "{a}");
                assert_eq!(a, host_interface_name(cid, ifname));
            }
        }
    }

    #[test]
    fn container_id_and_ifname_both_matter() {
        assert_ne!(host_interface_name("a", "eth0"), host_interface_name("b", "eth0"));
        assert_ne!(host_interface_name("a", "eth0"), host_interface_name("a", "eth1"));
        // The separator keeps ("a/b", "c") and ("a", "b/c") apart only by content, so the
        // runtime's rules (no '/' in either) are what make names unique; document by test.
        assert_eq!(host_interface_name("a/b", "c"), host_interface_name("a", "b/c"));
    }

    #[test]
    fn shape_check_rejects_everything_else() {
        for bad in ["", "flk", "eth0", "flk0123456789a", "flk0123456789abc", "flk0123456789aB", "FLK0123456789ab", "flk012345678\"ab"] {
            assert!(!is_host_interface_name(bad), "{bad}");
        }
        assert!(is_host_interface_name("flk0123456789ab"));
    }
}
