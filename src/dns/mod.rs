//! Egress by domain name, the pure parts: the names policies write ([`name`]), what a DNS
//! answer teaches ([`answer`]) and the proxy's rewriting and matching of one exchange with a
//! resolver ([`exchange`]). No sockets, no clock: the agent's DNS proxy
//! (`crate::dns_proxy::proxy`) feeds them bytes.

pub(crate) mod answer;
pub(crate) mod exchange;
pub(crate) mod name;

pub use answer::{Learned, Limits, Unusable, learn, response_to};
pub use name::{DomainPattern, PatternError};
