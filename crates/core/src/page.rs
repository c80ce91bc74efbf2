//! One page of an ordered listing, and the rule for where its read begins.
//!
//! Every listing of names (locks, namespaces, a namespace's keys, the gates' marks) is
//! read from an ordered index a page at a time: the names that start with `prefix` and
//! sort above `after` (the last name of the page before, if any), at most `limit` of
//! them. Each backend reads its own index (redb's tables, etcd's key space, a map in
//! memory), but where that read starts is the same rule for all of them: [`Page::start`].

use std::ops::Bound;

/// One page: names starting with `prefix`, above `after` if given, at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub prefix: String,
    /// The last name of the page before (exclusive).
    pub after: Option<String>,
    pub limit: usize,
}

impl Page {
    pub fn new(prefix: impl Into<String>, after: Option<&str>, limit: usize) -> Page {
        Page {
            prefix: prefix.into(),
            after: after.map(str::to_owned),
            limit,
        }
    }

    /// The first page of the names starting with `prefix`.
    pub fn first(prefix: impl Into<String>, limit: usize) -> Page {
        Page::new(prefix, None, limit)
    }

    /// Where the range read begins: just above `after` when that is at or past the
    /// prefix, else at the prefix itself (every name with the prefix sorts above an
    /// `after` below it). The read then stops at the first name without the prefix.
    pub fn start(&self) -> Bound<&str> {
        match &self.after {
            Some(after) if after.as_str() >= self.prefix.as_str() => Bound::Excluded(after),
            _ => Bound::Included(&self.prefix),
        }
    }

    /// Whether the page asks for nothing (`limit` 0): no read is needed.
    pub fn is_empty(&self) -> bool {
        self.limit == 0
    }

    /// Whether `name` belongs to the listing (it has the prefix); the read stops at the
    /// first one that does not.
    pub fn holds(&self, name: &str) -> bool {
        name.starts_with(&self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_starts_above_after_or_at_the_prefix() {
        assert_eq!(Page::first("a/", 5).start(), Bound::Included("a/"));
        assert_eq!(
            Page::new("a/", Some("a/2"), 5).start(),
            Bound::Excluded("a/2")
        );
        // An `after` below the prefix: every name with the prefix is above it.
        assert_eq!(Page::new("b", Some("a/9"), 5).start(), Bound::Included("b"));
        // An `after` equal to the prefix: the prefix itself is not listed again.
        assert_eq!(Page::new("b", Some("b"), 5).start(), Bound::Excluded("b"));
        // Past every name with the prefix: the read starts there and finds none.
        assert_eq!(Page::new("a/", Some("c"), 5).start(), Bound::Excluded("c"));
        assert!(Page::first("", 0).is_empty());
        assert!(Page::first("a/", 1).holds("a/x") && !Page::first("a/", 1).holds("b"));
    }
}
