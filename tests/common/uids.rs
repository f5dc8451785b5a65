//! Manifests with their pods' uids written out: the uid flockctl derives from
//! namespace/name for a pod without one (and names its host interface after), so that a
//! cluster loaded into an API server — which would assign its own — renders the same
//! interface names, chains and explanations as the manifests read offline.

#![allow(dead_code)]

use regex::Regex;

/// `text` with `uid: <derived>` added to every pod written as `kind: Pod`, `metadata:`,
/// `name:`, `namespace:` (block style, as the test manifests are).
pub fn with_derived_uids(text: &str) -> String {
    let pod = Regex::new(r"(?m)^kind: Pod\nmetadata:\n  name: (\S+)\n  namespace: (\S+)\n").unwrap();
    pod.replace_all(text, |c: &regex::Captures| {
        let uid = flock::model::derived_uid(&c[2], &c[1]);
        format!("{}  uid: {uid}\n", &c[0])
    })
    .into_owned()
}
