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

  TokenException(String message) {
    super(message);
  }

  /** The class's name as the test vectors spell it: {@code malformed}, {@code unknown_key}, ... */
  public abstract String refusal();

  /** Not a token of this format: its shape, encoding, claims or canonical form. */
  public static final class Malformed extends TokenException {
    private static final long serialVersionUID = 1L;

    Malformed(String why) {
      super("malformed token: " + why);
    }

    @Override
    public String refusal() {
      return "malformed";
    }
  }

  /** Signed by a key id the ring does not trust (unknown, or retired). */
  public static final class UnknownKey extends TokenException {
    private static final long serialVersionUID = 1L;

    UnknownKey(String keyId) {
      super("token signed by a key not trusted: " + keyId);
    }

    @Override
    public String refusal() {
      return "unknown_key";
    }
  }

  /** The signature does not verify under the named key's strict rules. */
  public static final class BadSignature extends TokenException {
    private static final long serialVersionUID = 1L;

    BadSignature() {
      super("token signature does not verify");
    }

    @Override
    public String refusal() {
      return "bad_signature";
    }
  }

  /** A genuine token, for another lock than the resource's. */
  public static final class WrongLock extends TokenException {
    private static final long serialVersionUID = 1L;
    private final String tokenLock;

    WrongLock(String tokenLock, String lock) {
      super("token is for lock \"" + tokenLock + "\", not \"" + lock + "\"");
      this.tokenLock = tokenLock;
    }

    /** The lock the token is for. */
    public String tokenLock() {
      return tokenLock;
    }

    @Override
    public String refusal() {
      return "wrong_lock";
    }
  }
}
