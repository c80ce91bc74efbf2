// The offline token verifier: byte for byte the rules of the Rust palisade-token crate.
package dev.palisade.token;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.PublicKey;
import java.security.Signature;
import java.util.Arrays;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Verifies Palisade fencing tokens offline, with the issuer's public keys and no call to
 * the issuer: the rules of docs/token-format.md, as the Rust, Go and Python verifiers
 * apply them.
 *
 * <p>A token is {@code pal1.<payload>.<signature>}: base64url without padding of the
 * claims JSON {@code {"l":<lock>,"e":<epoch>,"h":<holder>,"k":<key id>}} and of an Ed25519
 * signature over the ASCII bytes {@code pal1.<payload>}. In the Rust verifier's order:
 *
 * <ol>
 *   <li>at most 4096 bytes; exactly three parts; the prefix {@code pal1};
 *   <li>the payload is strict base64url of JSON with the four claims, of the right types;
 *   <li>a legal lock name, an epoch from 1 to 2^64-1, a holder of at most 256 bytes;
 *   <li>canonical form: the claims re-encoded as the issuer writes them are the payload's
 *       bytes exactly;
 *   <li>the key id names a trusted key; the signature is 64 bytes and verifies under
 *       ed25519-dalek's {@code verify_strict} rules: {@code s} below the group order, and
 *       neither {@code R} nor the key of small order (the JDK's Ed25519 does the equation;
 *       {@link SmallOrder} the rest).
 * </ol>
 *
 * <p>Verified tokens are cached by their whole text (signature included), so an edited
 * token never hits an entry made for the genuine one; the cache is bounded and a token
 * whose key is no longer trusted is refused, cached or not. Safe for concurrent use.
 *
 * <p>What it does not do: it does not know whether an epoch is still current (a genuine
 * token stays genuine forever; staleness is the resource's high-water decision), and it
 * is not access control.
 */
public final class Verifier {
  /** The version part of every token of this format. */
  public static final String PREFIX = "pal1";
  /** The longest token text accepted, in bytes. */
  public static final int MAX_TOKEN_LEN = 4096;
  /** The longest holder accepted, in bytes of UTF-8. */
  public static final int MAX_HOLDER_LEN = 256;

  private static final ObjectMapper JSON = new ObjectMapper();
  /** The order of the base point: a signature's {@code s} must be below it. */
  private static final BigInteger L =
      BigInteger.TWO.pow(252).add(new BigInteger("27742317777372353535851937790883648493"));
  private static final BigInteger MAX_EPOCH = BigInteger.TWO.pow(64).subtract(BigInteger.ONE);

  private volatile KeyRing ring;
  private final ConcurrentHashMap<String, Claims> cache = new ConcurrentHashMap<>();
  private final int capacity;

  /** A verifier trusting {@code ring} that remembers up to {@code capacity} tokens. */
  public Verifier(KeyRing ring, int capacity) {
    this.ring = ring;
    this.capacity = capacity;
  }

  /**
   * Trusts exactly {@code ring} from now on: tokens of a key not in it are refused from
   * the moment this returns, cached or not.
   */
  public void setKeys(KeyRing ring) {
    this.ring = ring;
  }

  /** Checks {@code token} and returns its claims. */
  public Claims verify(String token) throws TokenException {
    KeyRing keys = ring;
    Claims cached = cache.get(token);
    if (cached != null && keys.trusts(cached.keyId())) {
      return cached;
    }
    Claims claims = check(keys, token);
    if (capacity > 0) {
      if (cache.size() >= capacity) {
        cache.clear(); // a bounded cache; verifying again is only slower
      }
      cache.put(token, claims);
    }
    return claims;
  }

  /** Checks {@code token} as {@link #verify} does, and that it is for {@code lock}. */
  public Claims verifyFor(String token, String lock) throws TokenException {
    Claims claims = verify(token);
    if (!claims.lock().equals(lock)) {
      throw new TokenException.WrongLock(claims.lock(), lock);
    }
    return claims;
  }

  /** Whether {@code name} is a legal lock name: 1 to 128 of [A-Za-z0-9._-], not . or .. */
  public static boolean validLockName(String name) {
    if (name.isEmpty() || name.length() > 128 || name.equals(".") || name.equals("..")) {
      return false;
    }
    return Ascii.alphanumericOr(name, "._-");
  }

  /**
   * The payload the issuer writes for {@code claims}: the four claims in order, no white
   * space, strings escaped exactly as docs/token-format.md says.
   */
  public static byte[] canonicalPayload(Claims claims) {
    StringBuilder b = new StringBuilder(96);
    b.append("{\"l\":");
    writeString(b, claims.lock());
    b.append(",\"e\":").append(Long.toUnsignedString(claims.epoch()));
    b.append(",\"h\":");
    writeString(b, claims.holder());
    b.append(",\"k\":");
    writeString(b, claims.keyId());
    b.append('}');
    return b.toString().getBytes(StandardCharsets.UTF_8);
  }

  private static Claims check(KeyRing keys, String token) throws TokenException {
    if (token.length() > MAX_TOKEN_LEN
        || token.getBytes(StandardCharsets.UTF_8).length > MAX_TOKEN_LEN) {
      throw new TokenException.Malformed("token too long");
    }
    String[] parts = token.split("\\.", -1);
    if (parts.length != 3) {
      throw new TokenException.Malformed("expected pal1.<payload>.<signature>");
    }
    if (!parts[0].equals(PREFIX)) {
      throw new TokenException.Malformed("unknown token version");
    }
    byte[] payload = decodePart(parts[1], "payload");
    Claims claims = parseClaims(payload);
    if (!Arrays.equals(canonicalPayload(claims), payload)) {
      throw new TokenException.Malformed("payload is not in canonical form");
    }
    PublicKey key = keys.get(claims.keyId());
    if (key == null) {
      throw new TokenException.UnknownKey(claims.keyId());
    }
    byte[] signature = decodePart(parts[2], "signature");
    if (signature.length != 64) {
      throw new TokenException.Malformed("signature has the wrong length");
    }
    byte[] signed = (parts[0] + "." + parts[1]).getBytes(StandardCharsets.US_ASCII);
    if (!strictlyValid(key, signed, signature)) {
      throw new TokenException.BadSignature();
    }
    return claims;
  }

  private static boolean strictlyValid(PublicKey key, byte[] message, byte[] signature) {
    byte[] sBigEndian = new byte[32];
    for (int i = 0; i < 32; i++) {
      sBigEndian[i] = signature[63 - i];
    }
    if (new BigInteger(1, sBigEndian).compareTo(L) >= 0
        || SmallOrder.test(Arrays.copyOf(signature, 32))) {
      return false;
    }
    try {
      Signature ed25519 = Signature.getInstance("Ed25519");
      ed25519.initVerify(key);
      ed25519.update(message);
      return ed25519.verify(signature);
    } catch (GeneralSecurityException e) {
      return false;
    }
  }

  private static byte[] decodePart(String text, String what) throws TokenException {
    byte[] raw = KeyRing.Base64Url.decode(text);
    if (raw == null) {
      throw new TokenException.Malformed(what + " is not base64url without padding");
    }
    return raw;
  }

  /**
   * Reads the four claims and checks their shape. Spelling (order, white space, escapes,
   * extra or repeated fields) is left to the canonical check.
   */
  private static Claims parseClaims(byte[] payload) throws TokenException {
    JsonNode root;
    try {
      root = JSON.readTree(payload);
    } catch (IOException e) {
      throw new TokenException.Malformed("payload is not the JSON of the claims");
    }
    if (root == null || !root.isObject()) {
      throw new TokenException.Malformed("payload is not the JSON of the claims");
    }
    JsonNode l = root.get("l");
    JsonNode e = root.get("e");
    JsonNode h = root.get("h");
    JsonNode k = root.get("k");
    if (l == null || e == null || h == null || k == null) {
      throw new TokenException.Malformed("a claim is missing");
    }
    if (!l.isTextual() || !h.isTextual() || !k.isTextual()) {
      throw new TokenException.Malformed("a claim has the wrong type");
    }
    if (!e.isIntegralNumber()
        || e.bigIntegerValue().signum() <= 0
        || e.bigIntegerValue().compareTo(MAX_EPOCH) > 0) {
      throw new TokenException.Malformed("the epoch is not an integer from 1 to 2^64-1");
    }
    Claims claims = new Claims(l.textValue(), e.bigIntegerValue().longValue(), h.textValue(), k.textValue());
    if (!validLockName(claims.lock())) {
      throw new TokenException.Malformed("illegal lock name");
    }
    if (claims.holder().getBytes(StandardCharsets.UTF_8).length > MAX_HOLDER_LEN) {
      throw new TokenException.Malformed("holder longer than 256 bytes");
    }
    return claims;
  }

  private static void writeString(StringBuilder b, String s) {
    b.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> b.append("\\\"");
        case '\\' -> b.append("\\\\");
        case '\b' -> b.append("\\b");
        case '\t' -> b.append("\\t");
        case '\n' -> b.append("\\n");
        case '\f' -> b.append("\\f");
        case '\r' -> b.append("\\r");
        default -> {
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
        }
      }
    }
    b.append('"');
  }
}
