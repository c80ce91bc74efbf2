//! Real-time queries shared by the checkers: "of the operations that happened before
//! time t, which carried the largest epoch?" in O(log n) after an O(n log n) build.

use crate::history::{Epoch, Op, Time};

/// Operations keyed by a time (usually their end), with the running maximum epoch.
pub(crate) struct PrefixMax<'a> {
    times: Vec<Time>,
    /// `best[i]`: the op with the largest epoch among the first `i + 1` by time (the
    /// earliest such op on ties).
    best: Vec<(Epoch, &'a Op)>,
}

impl<'a> PrefixMax<'a> {
    /// `items`: (time, epoch, op) in any order.
    pub(crate) fn new(mut items: Vec<(Time, Epoch, &'a Op)>) -> PrefixMax<'a> {
        items.sort_by_key(|&(t, _, op)| (t, op.index));
        let mut best: Vec<(Epoch, &'a Op)> = Vec::with_capacity(items.len());
        for &(_, epoch, op) in &items {
            let next = match best.last() {
                Some(&(max, max_op)) if max >= epoch => (max, max_op),
                _ => (epoch, op),
            };
            best.push(next);
        }
        PrefixMax {
            times: items.iter().map(|&(t, _, _)| t).collect(),
            best,
        }
    }

    /// Largest epoch among items with time strictly before `t`.
    pub(crate) fn before(&self, t: Time) -> Option<(Epoch, &'a Op)> {
        let n = self.times.partition_point(|&x| x < t);
        n.checked_sub(1).map(|i| self.best[i])
    }

    /// Largest epoch among items with time at or before `t`.
    pub(crate) fn up_to(&self, t: Time) -> Option<(Epoch, &'a Op)> {
        let n = self.times.partition_point(|&x| x <= t);
        n.checked_sub(1).map(|i| self.best[i])
    }
}

/// Restart markers, to say how many restarts lie between two instants.
pub(crate) struct Restarts(Vec<Time>);

impl Restarts {
    pub(crate) fn of(ops: &[Op]) -> Restarts {
        let mut times: Vec<Time> = ops
            .iter()
            .filter(|op| op.kind == crate::history::OpKind::Restart)
            .map(|op| op.invoke)
            .collect();
        times.sort_unstable();
        Restarts(times)
    }

    /// Restarts at instants in `[from, to]` (either order).
    pub(crate) fn between(&self, a: Time, b: Time) -> usize {
        let (from, to) = (a.min(b), a.max(b));
        self.0.partition_point(|&t| t <= to) - self.0.partition_point(|&t| t < from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OpKind;

    #[test]
    fn prefix_max_answers_strict_and_inclusive_queries() {
        let ops: Vec<Op> = (0..3)
            .map(|i| Op::new(i, OpKind::Write, 0).ok(10 * (i + 1)))
            .collect();
        // (end, epoch): (10, 5), (20, 3), (30, 7)
        let items = vec![(30, 7, &ops[2]), (10, 5, &ops[0]), (20, 3, &ops[1])];
        let pm = PrefixMax::new(items);
        assert_eq!(pm.before(10), None);
        assert_eq!(pm.up_to(10).map(|(e, op)| (e, op.process)), Some((5, 0)));
        assert_eq!(pm.before(30).map(|(e, op)| (e, op.process)), Some((5, 0)));
        assert_eq!(pm.up_to(30).map(|(e, op)| (e, op.process)), Some((7, 2)));
    }

    #[test]
    fn restarts_are_counted_inclusively_in_either_order() {
        let ops = vec![
            Op::new(0, OpKind::Restart, 5).ok(5),
            Op::new(0, OpKind::Restart, 15).ok(15),
        ];
        let r = Restarts::of(&ops);
        assert_eq!(r.between(0, 20), 2);
        assert_eq!(r.between(20, 5), 2);
        assert_eq!(r.between(6, 14), 0);
    }
}
