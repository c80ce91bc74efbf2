//! Limits of the recipes built on leases: lock values and per-lock lock-delay.

/// Largest lock value, in bytes (before encoding). On the wire (JSON) a value is
/// standard base64 with padding (RFC 4648 section 4), so its text is at most 5,464
/// characters.
pub const MAX_LOCK_VALUE_BYTES: usize = 4096;

/// Default of the server's `--max-lock-delay-ms`: the longest lock-delay an acquisition
/// may choose (Chubby's bound is one minute too).
pub const DEFAULT_MAX_LOCK_DELAY_MS: u64 = 60_000;
