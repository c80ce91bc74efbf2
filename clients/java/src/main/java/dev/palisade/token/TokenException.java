// The refusal classes of docs/token-format.md, one exception type each.
package dev.palisade.token;

/**
 * A token the verifier refused. Each refusal is one of the four classes of
 * docs/token-format.md, a subclass of this one: {@link Malformed}, {@link UnknownKey},
 * {@link BadSignature}, {@link WrongLock}.
 */
public abstract sealed class TokenException extends Exception
    permits TokenException.Malformed,
        TokenException.UnknownKey,
        TokenException.BadSignature,
        TokenException.WrongLock {
  private static final long serialVersionUID = 1L;
  private final String refusal;

  TokenException(String refusal, String message) {
    super(message);
    this.refusal = refusal;
  }

  /** The class's name as the test vectors spell it: {@code malformed}, {@code unknown_key}, ... */
  public String refusal() {
    return refusal;
  }

  /** Not a token of this format: its shape, encoding, claims or canonical form. */
  public static final class Malformed extends TokenException {
    private static final long serialVersionUID = 1L;

    Malformed(String why) {
      super("malformed", "malformed token: " + why);
    }
  }

  /** Signed by a key id the ring does not trust (unknown, or retired). */
  public static final class UnknownKey extends TokenException {
    private static final long serialVersionUID = 1L;

    UnknownKey(String keyId) {
      super("unknown_key", "token signed by a key not trusted: " + keyId);
    }
  }

  /** The signature does not verify under the named key's strict rules. */
  public static final class BadSignature extends TokenException {
    private static final long serialVersionUID = 1L;

    BadSignature() {
      super("bad_signature", "token signature does not verify");
    }
  }

  /** A genuine token, for another lock than the resource's. */
  public static final class WrongLock extends TokenException {
    private static final long serialVersionUID = 1L;
    private final String tokenLock;

    WrongLock(String tokenLock, String lock) {
      super("wrong_lock", "token is for lock \"" + tokenLock + "\", not \"" + lock + "\"");
      this.tokenLock = tokenLock;
    }

    /** The lock the token is for. */
    public String tokenLock() {
      return tokenLock;
    }
  }
}
