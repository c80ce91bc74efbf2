//! Which gate policy each namespace uses (`--namespace-policy`).

use palisade_core::gate::Policy;

/// Which namespaces use which gate policy. Rules are `name=policy` or `prefix*=policy`;
/// an exact name wins over a prefix, a longer prefix over a shorter one, and namespaces
/// matching no rule use [`Policy::Epoch`].
#[derive(Debug, Clone, Default)]
pub struct NamespacePolicies {
    exact: std::collections::HashMap<String, Policy>,
    prefixes: Vec<(String, Policy)>,
}

impl NamespacePolicies {
    /// Parses rules like `orders=sequence` or `jobs.*=sequence`.
    pub fn parse<'a>(rules: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut out = NamespacePolicies::default();
        for rule in rules {
            let rule = rule.trim();
            if rule.is_empty() {
                continue;
            }
            let (name, policy) = rule
                .split_once('=')
                .ok_or_else(|| format!("policy rule {rule:?} is not NAME=POLICY"))?;
            let policy: Policy = policy.trim().parse()?;
            let name = name.trim();
            match name.strip_suffix('*') {
                Some(prefix) => out.prefixes.push((prefix.to_owned(), policy)),
                None => {
                    palisade_token::validate_lock_name(name)
                        .map_err(|e| format!("policy rule {rule:?}: {e}"))?;
                    out.exact.insert(name.to_owned(), policy);
                }
            }
        }
        out.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        Ok(out)
    }

    /// The policy for a namespace.
    pub fn policy(&self, namespace: &str) -> Policy {
        if let Some(p) = self.exact.get(namespace) {
            return *p;
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| namespace.starts_with(prefix.as_str()))
            .map(|(_, p)| *p)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_resolve_exact_then_longest_prefix() {
        let p = NamespacePolicies::parse(["jobs.*=sequence", "jobs.fast*=epoch", "audit=sequence"])
            .unwrap();
        assert_eq!(p.policy("audit"), Policy::Sequence);
        assert_eq!(p.policy("jobs.a"), Policy::Sequence);
        assert_eq!(p.policy("jobs.fast1"), Policy::Epoch);
        assert_eq!(p.policy("other"), Policy::Epoch);
        assert!(NamespacePolicies::parse(["nope"]).is_err());
        assert!(NamespacePolicies::parse(["a=strict"]).is_err());
        assert!(NamespacePolicies::parse(["a/b=epoch"]).is_err());
    }
}
