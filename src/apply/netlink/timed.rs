//! Learned elements: addresses a domain rule admits until the TTL of the DNS answer that
//! taught them passes. They live in the kernel, in timed sets (`flags timeout`) of flock's
//! table, written here one batch per answer and expired by nf_tables itself; a dump reads them
//! back (an agent that restarts rebuilds its view from the kernel, and `explain` says when an
//! address expires).
//!
//! Writing an element that is already there refreshes its timeout on kernels since 6.10
//! (element timeout updates); older kernels keep the earlier expiry, so the address is
//! admitted for less than the new TTL — fewer packets allowed, never more.

use std::net::IpAddr;
use std::time::Duration;

use super::transaction::comment_attr;
use super::{
    Batch, ElementWriter, NFT_MSG_DELSETELEM, NFT_MSG_NEWSETELEM, NFTA_DATA_VALUE, NFTA_LIST_ELEM, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_USERDATA, NFTNL_UDATA_SET_ELEM_COMMENT,
    NLM_F_CREATE, NetlinkError, NfSocket, attr, attributes, nested, nul_terminated,
};
use crate::render::names::{self, TABLE};

const NFT_MSG_GETSETELEM: u16 = 13;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;

/// An address to admit for `timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedElement {
    pub addr: IpAddr,
    pub timeout: Duration,
    /// Shown by `nft list`; made safe for nft as every comment flock writes
    /// ([`crate::render::names::comment`]: printable, no quotes, at most 128 bytes).
    pub comment: String,
}

/// An element read back from a timed set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedEntry {
    pub addr: IpAddr,
    /// The timeout it was written with.
    pub timeout: Duration,
    /// What is left of it.
    pub expires_in: Duration,
    pub comment: String,
}

fn key(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The batch that deletes `evict`'s addresses from their timed sets, then adds each set's
/// elements to that timed set of flock's table (refreshing the timeouts of those already there,
/// where the kernel can): one transaction for all of them. Deleting an address the set does not
/// hold (it expired meanwhile) fails the whole batch.
pub(crate) fn encode_timed<S: AsRef<str>>(sets: &[(S, Vec<TimedElement>)], evict: &[(S, Vec<IpAddr>)]) -> Result<Batch, NetlinkError> {
    let mut batch = Batch::new();
    for (set, addrs) in evict {
        let mut w = ElementWriter::new(&mut batch, set.as_ref(), None, NFT_MSG_DELSETELEM, 0, "evicting learned addresses from set");
        for a in addrs {
            w.element(|b| {
                nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &key(*a)));
                Ok::<(), NetlinkError>(())
            })?;
        }
    }
    for (set, elements) in sets {
        let set = set.as_ref();
        let mut w = ElementWriter::new(&mut batch, set, None, NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding learned addresses to set");
        for e in elements {
            w.element(|b| {
                nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &key(e.addr)));
                attr(b, NFTA_SET_ELEM_TIMEOUT, &millis(e.timeout).to_be_bytes());
                if !e.comment.is_empty() {
                    comment_attr(b, NFTA_SET_ELEM_USERDATA, NFTNL_UDATA_SET_ELEM_COMMENT, &names::comment(&e.comment))
                        .map_err(|why| NetlinkError::Encode { set: set.to_string(), key: e.addr.to_string(), why })?;
                }
                Ok(())
            })?;
        }
    }
    Ok(batch)
}

impl NfSocket {
    /// Deletes `evict`'s addresses from their timed sets and adds each set's elements, in one
    /// batch.
    pub fn write_timed<S: AsRef<str>>(&mut self, sets: &[(S, Vec<TimedElement>)], evict: &[(S, Vec<IpAddr>)]) -> Result<(), NetlinkError> {
        self.send(encode_timed(sets, evict)?)
    }

    /// Every element of the timed set `set`, with what is left of its timeout, by address.
    pub fn dump_timed(&mut self, set: &str) -> Result<Vec<LearnedEntry>, NetlinkError> {
        let mut body = Vec::new();
        attr(&mut body, NFTA_SET_ELEM_LIST_TABLE, &nul_terminated(TABLE));
        attr(&mut body, NFTA_SET_ELEM_LIST_SET, &nul_terminated(set));
        let mut out = Vec::new();
        for reply in self.dump(NFT_MSG_GETSETELEM, &body, "listing set", set)? {
            out.extend(decode_elements(&reply).map_err(NetlinkError::Protocol)?);
        }
        // A hash set lists in no stable order.
        out.sort_by_key(|e: &LearnedEntry| e.addr);
        Ok(out)
    }
}

/// The elements of one `NEWSETELEM` message body (after nfgenmsg).
fn decode_elements(body: &[u8]) -> Result<Vec<LearnedEntry>, String> {
    let mut out = Vec::new();
    for (ty, list) in attributes(body) {
        if ty != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for (ty, element) in attributes(list) {
            if ty != NFTA_LIST_ELEM {
                continue;
            }
            let mut entry =
                LearnedEntry { addr: IpAddr::from([0u8; 4]), timeout: Duration::ZERO, expires_in: Duration::ZERO, comment: String::new() };
            let mut has_key = false;
            for (ty, value) in attributes(element) {
                match ty {
                    NFTA_SET_ELEM_KEY => {
                        let data = attributes(value).find(|(t, _)| *t == NFTA_DATA_VALUE).map(|(_, v)| v).unwrap_or_default();
                        entry.addr = match data.len() {
                            4 => IpAddr::from(<[u8; 4]>::try_from(data).map_err(|e| e.to_string())?),
                            16 => IpAddr::from(<[u8; 16]>::try_from(data).map_err(|e| e.to_string())?),
                            n => return Err(format!("a key of {n} bytes in a set of addresses")),
                        };
                        has_key = true;
                    }
                    NFTA_SET_ELEM_TIMEOUT => entry.timeout = Duration::from_millis(be_u64(value)?),
                    NFTA_SET_ELEM_EXPIRATION => entry.expires_in = Duration::from_millis(be_u64(value)?),
                    NFTA_SET_ELEM_USERDATA if value.len() >= 2 && value[0] == NFTNL_UDATA_SET_ELEM_COMMENT => {
                        let len = usize::from(value[1]).min(value.len() - 2);
                        entry.comment = String::from_utf8_lossy(&value[2..2 + len]).trim_end_matches('\0').to_string();
                    }
                    _ => {}
                }
            }
            if !has_key {
                return Err("an element without a key".into());
            }
            out.push(entry);
        }
    }
    Ok(out)
}

fn be_u64(v: &[u8]) -> Result<u64, String> {
    <[u8; 8]>::try_from(v).map(u64::from_be_bytes).map_err(|_| format!("a {}-byte time", v.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnetlink::messages;

    #[test]
    fn comments_are_made_safe_for_nft() {
        let long = format!("\"{}", "é".repeat(100));
        let batch = encode_timed(
            &[("dom-x", vec![TimedElement { addr: "198.18.1.10".parse().unwrap(), timeout: Duration::from_secs(1), comment: long }])],
            &[],
        );
        let (buf, _) = batch.unwrap().finish();
        let msgs: Vec<_> = messages(&buf).map(Result::unwrap).collect();
        let comment = &decode_elements(&msgs[1].3[4..]).unwrap()[0].comment;
        assert!(comment.len() <= names::MAX_COMMENT && comment.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"'), "{comment:?}");
    }

    #[test]
    fn an_encoded_batch_decodes_back() {
        let elements = vec![
            TimedElement { addr: "198.18.1.10".parse().unwrap(), timeout: Duration::from_secs(30), comment: "api.example.test".into() },
            TimedElement { addr: "2001:db8:1::10".parse().unwrap(), timeout: Duration::from_millis(1500), comment: String::new() },
        ];
        let batch = encode_timed(&[("dom-x", elements.clone()), ("dom-y", Vec::new())], &[]).unwrap();
        assert!(!batch.is_empty());
        let (buf, _) = batch.finish();
        // BATCH_BEGIN, the element message, BATCH_END: decode the middle one's elements.
        let msgs: Vec<_> = messages(&buf).map(Result::unwrap).collect();
        assert_eq!(msgs.len(), 3);
        let decoded = decode_elements(&msgs[1].3[4..]).unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!(
            (decoded[0].addr, decoded[0].timeout, decoded[0].comment.as_str()),
            (elements[0].addr, elements[0].timeout, "api.example.test")
        );
        assert_eq!((decoded[1].addr, decoded[1].timeout), (elements[1].addr, elements[1].timeout));
    }
}
