//! How a lock value is written down: standard base64 with padding, the same text the
//! HTTP API carries (docs/api.md), so a record and an answer read alike.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// A value as text.
pub fn encode(value: &[u8]) -> String {
    STANDARD.encode(value)
}

/// A value from its text; `None` if the text is not standard base64.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_round_trip_and_bad_text_is_refused() {
        for value in [&b""[..], b"leader-1:7700", &[0u8, 255, 10, 13][..]] {
            assert_eq!(super::decode(&super::encode(value)).as_deref(), Some(value));
        }
        assert_eq!(super::encode(b"hi"), "aGk=");
        assert_eq!(super::decode("not base64!"), None);
        assert_eq!(super::decode("aGk"), None, "padding is required");
    }
}
