//! [`Deadlines`]: until when a holder may act, and when it gives its lease up, both
//! derived from the TTL.
//!
//! Let `s` be the time the last renewal the server confirmed was *sent* (at first, the
//! acquisition's send) and `t` the TTL the server granted with it. The server counts its
//! lease from when it handled that request, which is after `s`, so by equal clocks the
//! lease runs at least until `s + t`. Clocks do not run at equal rates; with this host's
//! clock at most a fraction `drift` slower than the server's, the lease runs at least
//! until `s + t·(1 − drift)` by this host's clock. Hence:
//!
//! - **safe until** `s + t·(1 − drift)`: the time until which the holder may act. It is in
//!   the past once the server has said the lease expired.
//! - **renewal deadline** `s + t·renew`: if no renewal has succeeded by then, the client
//!   gives the lease up itself (stops renewing and reports it lost), as Kubernetes' leader
//!   election does at its `renewDeadline`. What is still running then has
//!   `t·(1 − drift − renew)` to stop before the safe deadline (`palisade lock run`: SIGTERM
//!   at the renewal deadline, SIGKILL at the safe deadline).
//!
//! Defaults: `renew` = 2/3 (Kubernetes: 10 s of 15 s), `drift` = 1 %, twenty times the
//! 500 ppm that NTP allows a disciplined clock. Renewals are sent every `t / 3`, so the
//! default leaves room for the first renewal and its retries before the client gives up.
//!
//! ## What it does not promise
//! The deadlines narrow the window in which an old holder can still act; they do not close
//! it. A process paused after it checked [`crate::LeaseGuard::safe_for`], a request already
//! in flight, or clocks that drift apart faster than `drift`, can still reach a resource
//! after the lease ended. Only a resource that checks the token (fencing) refuses them.

use std::time::Duration;

use crate::Error;

/// How a client derives a holder's deadlines from its TTL (see the module docs). One value
/// serves every lease and session of a [`crate::Client`]
/// ([`crate::ClientBuilder::deadlines`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadlines {
    renew: f64,
    drift: f64,
}

impl Deadlines {
    /// The default renewal deadline, as a fraction of the TTL.
    pub const DEFAULT_RENEW_DEADLINE: f64 = 2.0 / 3.0;
    /// The default clock-rate drift assumed between this host and the server.
    pub const DEFAULT_CLOCK_DRIFT: f64 = 0.01;

    /// `renew_deadline`: the fraction of the TTL after the last confirmed renewal at which
    /// the client gives the lease up; more than 1/3 (a renewal is sent every TTL/3) and at
    /// most `1 - clock_drift`. `clock_drift`: the largest rate difference assumed between
    /// this host's clock and the server's, from 0 to 0.5. Anything else is
    /// [`Error::Config`].
    pub fn new(renew_deadline: f64, clock_drift: f64) -> Result<Deadlines, Error> {
        if !(0.0..=0.5).contains(&clock_drift) {
            return Err(Error::Config(format!(
                "clock drift {clock_drift} is outside 0 ..= 0.5 (a fraction: 0.01 is 1 %)"
            )));
        }
        if !(renew_deadline > 1.0 / 3.0 && renew_deadline <= 1.0 - clock_drift) {
            return Err(Error::Config(format!(
                "renewal deadline {renew_deadline} (a fraction of the TTL) must be more than \
                 1/3, when the first renewal is sent, and at most 1 - clock drift = {}",
                1.0 - clock_drift
            )));
        }
        Ok(Deadlines {
            renew: renew_deadline,
            drift: clock_drift,
        })
    }

    /// The renewal deadline, as a fraction of the TTL.
    pub fn renew_deadline(&self) -> f64 {
        self.renew
    }

    /// The clock-rate drift assumed, as a fraction.
    pub fn clock_drift(&self) -> f64 {
        self.drift
    }

    /// From a confirmed renewal's send to the safe deadline: `ttl · (1 − drift)`.
    pub fn safe_span(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(1.0 - self.drift)
    }

    /// From a confirmed renewal's send to the renewal deadline: `ttl · renew`.
    pub fn renew_span(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.renew)
    }
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            renew: Self::DEFAULT_RENEW_DEADLINE,
            drift: Self::DEFAULT_CLOCK_DRIFT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_leave_a_third_of_the_ttl_less_the_drift_to_stop() {
        let d = Deadlines::default();
        let ttl = Duration::from_secs(9);
        assert_eq!(d.renew_span(ttl), Duration::from_secs(6));
        assert_eq!(d.safe_span(ttl), Duration::from_millis(8_910));
        assert_eq!(Deadlines::new(2.0 / 3.0, 0.01).unwrap(), d);
    }

    #[test]
    fn deadlines_that_cannot_hold_are_refused() {
        for (renew, drift) in [
            (1.0 / 3.0, 0.01), // no renewal would ever be tried
            (0.2, 0.0),
            (1.0, 0.01), // the client would give up after the safe deadline
            (0.7, 0.6),  // drift out of range
            (0.7, -0.1),
            (f64::NAN, 0.01),
            (0.7, f64::NAN),
        ] {
            let e = Deadlines::new(renew, drift).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{renew} {drift}: {e:?}");
        }
        assert!(Deadlines::new(0.99, 0.01).is_ok());
        assert!(Deadlines::new(0.5, 0.0).is_ok());
    }
}
