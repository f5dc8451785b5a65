//! The policies `flockctl explain` and its live mode are tested with, over the base cluster:
//! a NetworkPolicy admitting port 80 to x/a, an egress-isolated y/b, and an Admin
//! ClusterNetworkPolicy keeping z out of x.

pub const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {}}]
      ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-out, namespace: y}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Egress]
  egress:
    - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-x}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
    - name: no-z
      action: Deny
      from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]
"#;
