//! Egress by domain name, the pure parts: the names policies write ([`name`]) and what a DNS
//! answer teaches ([`answer`]). No sockets, no clock: the agent's DNS proxy (to come, issue
//! "Egress by domain name") feeds them bytes.

pub mod answer;
pub mod name;

pub use answer::{Learned, Limits, Unusable, learn, response_to};
pub use name::DomainPattern;
