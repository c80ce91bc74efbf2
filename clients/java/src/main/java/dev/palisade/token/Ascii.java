// The strict ASCII spellings of the token format: base64url text and lock names.
package dev.palisade.token;

/** Character checks shared by the key ring's base64url decoder and the verifier. */
final class Ascii {
  private Ascii() {}

  /** Whether every character of {@code text} is an ASCII letter or digit, or one of {@code extra}. */
  static boolean alphanumericOr(String text, String extra) {
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      boolean ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || extra.indexOf(c) >= 0;
      if (!ok) {
        return false;
      }
    }
    return true;
  }
}
