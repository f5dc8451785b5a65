//! Labels of a namespace or pod, stored compactly: the snapshot holds every pod of the
//! cluster, and labels were most of a pod's memory as a `BTreeMap<String, String>` (a
//! B-tree node of eleven slots, plus two allocations per label).
//!
//! [`Labels`] is a sorted boxed slice of interned strings. Keys and values repeat across
//! thousands of pods (`app`, `tier`, a deployment's `pod-template-hash`), so each distinct
//! string is stored once ([`intern`]); the pool drops strings no pod uses any more whenever
//! it has doubled since the last sweep, so churning values (a Job's `controller-uid`) do not
//! accumulate.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

struct Pool {
    strings: HashSet<Arc<str>>,
    sweep_at: usize,
}

/// The pool is split in shards, each behind its own lock, so that threads parsing a large
/// manifest together rarely wait for each other; a string's shard is a cheap function of its
/// length and last byte (anyone can put every string in one shard: that is one pool, as
/// before, not worse).
const SHARDS: usize = 16;

/// A shard sweeps once it holds this many strings (and then whenever it has doubled).
const MIN_SWEEP: usize = 256;

static POOL: LazyLock<[Mutex<Pool>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::new(Pool { strings: HashSet::new(), sweep_at: MIN_SWEEP })));

fn shard(s: &str) -> usize {
    (s.len() ^ usize::from(s.as_bytes().last().copied().unwrap_or(0))) % SHARDS
}

/// The shared copy of `s`.
pub(crate) fn intern(s: &str) -> Arc<str> {
    let mut pool = match POOL[shard(s)].lock() {
        Ok(p) => p,
        // A panic elsewhere while holding the lock cannot leave the set inconsistent.
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(shared) = pool.strings.get(s) {
        return Arc::clone(shared);
    }
    if pool.strings.len() >= pool.sweep_at {
        pool.strings.retain(|s| Arc::strong_count(s) > 1);
        pool.sweep_at = (2 * pool.strings.len()).max(MIN_SWEEP);
    }
    let shared: Arc<str> = Arc::from(s);
    pool.strings.insert(Arc::clone(&shared));
    shared
}

fn find(entries: &[(Arc<str>, Arc<str>)], key: &str) -> Result<usize, usize> {
    entries.binary_search_by(|(k, _)| (**k).cmp(key))
}

/// A label set: keys unique, sorted.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(Box<[(Arc<str>, Arc<str>)]>);

impl Labels {
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        find(&self.0, key)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).ok().map(|i| &*self.0[i].1)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Sets `key` to `value`, returning the previous value.
    pub fn insert(&mut self, key: impl AsRef<str>, value: impl AsRef<str>) -> Option<Arc<str>> {
        let value = intern(value.as_ref());
        let mut entries = std::mem::take(&mut self.0).into_vec();
        let old = match find(&entries, key.as_ref()) {
            Ok(i) => Some(std::mem::replace(&mut entries[i].1, value)),
            Err(i) => {
                entries.insert(i, (intern(key.as_ref()), value));
                None
            }
        };
        self.0 = entries.into_boxed_slice();
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<Arc<str>> {
        let i = self.position(key).ok()?;
        let mut entries = std::mem::take(&mut self.0).into_vec();
        let (_, v) = entries.remove(i);
        self.0 = entries.into_boxed_slice();
        Some(v)
    }

    /// The labels in key order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    #[cfg(feature = "testkit")]
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.iter().map(|(k, _)| &**k)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// As a map of owned strings (for API objects and output).
    #[cfg(feature = "testkit")]
    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    /// The last value of a repeated key wins, as for a map.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(Arc<str>, Arc<str>)> = iter.into_iter().map(|(k, v)| (intern(k.as_ref()), intern(v.as_ref()))).collect();
        // Usually sorted already (a map's labels): then there is nothing to do.
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            // Stable: of equal keys, the last one stays last.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries = super::keep_last(entries, |a, b| a.0 == b.0);
        }
        Self(entries.into_boxed_slice())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for Labels {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        map.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a str, &'a str);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a str)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Labels {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for Labels {
    // Decoded as a map, as before this type existed: the committed fuzz corpora keep meaning
    // the same inputs.
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(BTreeMap::<String, String>::arbitrary(u)?.into())
    }

    fn arbitrary_take_rest(u: arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(BTreeMap::<String, String>::arbitrary_take_rest(u)?.into())
    }

    fn size_hint(depth: usize) -> (usize, Option<usize>) {
        BTreeMap::<String, String>::size_hint(depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_a_sorted_map() {
        let mut l = Labels::from([("b", "2"), ("a", "1"), ("b", "3")]);
        assert_eq!(l.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "3")]);
        assert_eq!(l.get("b"), Some("3"));
        assert!(l.contains_key("a") && !l.contains_key("c"));
        assert_eq!(l.insert("c", "4"), None);
        assert_eq!(l.insert("a", "5").as_deref(), Some("1"));
        assert_eq!(l.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(l.remove("b").as_deref(), Some("3"));
        assert_eq!(l.len(), 2);
        assert_eq!(l, Labels::from([("c", "4"), ("a", "5")]));
        let repeated = Labels::from([("b", "1"), ("a", "1"), ("b", "2"), ("a", "3"), ("b", "4")]);
        assert_eq!(repeated.iter().collect::<Vec<_>>(), [("a", "3"), ("b", "4")]);
        assert_eq!(format!("{l:?}"), r#"{"a": "5", "c": "4"}"#);
    }

    #[test]
    fn equal_strings_are_stored_once_and_unused_ones_are_swept() {
        let a = Labels::from([("app", "shared-value")]);
        let b = Labels::from([("app", "shared-value")]);
        assert!(Arc::ptr_eq(&a.0[0].1, &b.0[0].1));
        // Many strings nobody keeps: the pool sweeps them instead of growing without bound.
        for i in 0..4 * SHARDS * MIN_SWEEP {
            drop(intern(&format!("churn-{i}")));
        }
        let pool: usize = POOL.iter().map(|p| p.lock().map(|p| p.strings.len()).unwrap_or(usize::MAX)).sum();
        assert!(pool <= 2 * SHARDS * MIN_SWEEP, "pool holds {pool} strings");
        assert!(Arc::ptr_eq(&a.0[0].1, &intern("shared-value")));
    }
}
