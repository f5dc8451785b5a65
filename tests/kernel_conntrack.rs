//! The ctnetlink socket against the real kernel, in a throwaway network namespace (root
//! only): entries created, listed and marked as flock's revocation needs them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::IpAddr;

use flock::conntrack::{ConntrackSocket, Entry, NewEntry, Tuple};
use flock::netns;
use flock::testkit::kernel::{NetnsGuard, require_root};

const BIT: u32 = 0x0100_0000;

fn tuple(src: &str, dst: &str, protocol: u8, sport: u16, dport: u16) -> Tuple {
    Tuple { src: src.parse::<IpAddr>().unwrap(), dst: dst.parse::<IpAddr>().unwrap(), protocol, sport, dport }
}

#[test]
fn entries_are_created_listed_and_marked_in_their_namespace() {
    if !require_root("entries_are_created_listed_and_marked_in_their_namespace") {
        return;
    }
    let ns = NetnsGuard::new("ct");
    let flows = [
        tuple("198.18.0.5", "198.18.1.7", 6, 40000, 80),
        tuple("2001:db8::5", "2001:db8::7", 17, 5353, 53),
        tuple("198.18.0.6", "198.18.1.7", 132, 3000, 9000),
    ];
    let after = netns::run_in(&ns.netns(), move || {
        let mut s = ConntrackSocket::open().unwrap();
        for f in flows {
            // Another agent's bits of the ct mark are set on every entry.
            s.create(&NewEntry { mark: 0x5, ..NewEntry::plain(f, 600) }).unwrap();
        }
        // Creating it twice is refused (an exclusive create).
        assert!(s.create(&NewEntry::plain(flows[0], 600)).is_err());
        let dump = s.dump().unwrap();
        assert!(dump.unreadable.is_empty(), "{:?}", dump.unreadable);
        let listed = dump.entries;
        let ours: Vec<&Entry> = listed.iter().filter(|e| flows.contains(&e.orig)).collect();
        assert_eq!(ours.len(), 3, "{listed:?}");
        assert!(ours.iter().all(|e| e.id.is_some() && e.mark == 0x5));
        let tcp = ours.iter().find(|e| e.orig.protocol == 6).unwrap();
        assert_eq!(tcp.tcp_state, Some(3), "created established");
        assert!(!tcp.is_closed());
        // Mark the TCP and SCTP entries; clear the SCTP one again.
        let doomed: Vec<&Entry> = ours.iter().copied().filter(|e| e.orig.protocol != 17).collect();
        let c = s.set_mark(&doomed, BIT, true).unwrap();
        assert_eq!((c.changed, c.gone, c.failed.len()), (2, 0, 0));
        let sctp: Vec<&Entry> = doomed.iter().copied().filter(|e| e.orig.protocol == 132).collect();
        assert_eq!(s.set_mark(&sctp, BIT, false).unwrap().changed, 1);
        s.dump().unwrap().entries
    })
    .unwrap();
    let mark = |p: u8| after.iter().find(|e| e.orig.protocol == p).map(|e| e.mark);
    assert_eq!((mark(6), mark(17), mark(132)), (Some(BIT | 0x5), Some(0x5), Some(0x5)));

    // The host's table is another namespace's: none of these are there.
    let host = ConntrackSocket::open().unwrap().dump().unwrap();
    assert!(!host.entries.iter().any(|e| flows.contains(&e.orig)));
}

#[test]
fn an_entry_gone_before_the_mark_is_counted_gone() {
    if !require_root("an_entry_gone_before_the_mark_is_counted_gone") {
        return;
    }
    let ns = NetnsGuard::new("ct-gone");
    let flow = tuple("198.18.0.9", "198.18.1.9", 17, 1000, 53);
    netns::run_in(&ns.netns(), move || {
        let mut s = ConntrackSocket::open().unwrap();
        s.create(&NewEntry::plain(flow, 1)).unwrap();
        let listed = s.dump().unwrap().entries;
        assert_eq!(listed.len(), 1);
        // A one-second timeout: the entry expires before it is marked.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !s.dump().unwrap().entries.is_empty() {
            assert!(std::time::Instant::now() < until, "the entry did not expire");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let c = s.set_mark(&[&listed[0]], BIT, true).unwrap();
        assert_eq!((c.changed, c.gone), (0, 1));
    })
    .unwrap();
}

#[test]
fn many_entries_are_listed_and_marked_in_windows() {
    if !require_root("many_entries_are_listed_and_marked_in_windows") {
        return;
    }
    let ns = NetnsGuard::new("ct-many");
    netns::run_in(&ns.netns(), || {
        let mut s = ConntrackSocket::open().unwrap();
        for i in 0..3000u16 {
            s.create(&NewEntry::plain(tuple("198.18.0.1", "198.18.1.1", 6, 10000 + i, 80), 600)).unwrap();
        }
        let dump = s.dump().unwrap();
        assert_eq!(dump.entries.len(), 3000);
        let c = s.set_mark(&dump.entries.iter().collect::<Vec<_>>(), BIT, true).unwrap();
        assert_eq!(c.changed, 3000);
        assert!(s.dump().unwrap().entries.iter().all(|e| e.mark == BIT));
    })
    .unwrap();
}
