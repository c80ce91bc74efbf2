// The public keys a resource trusts, by key id, and the ring GET /v1/keys describes.
package dev.palisade.token;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.security.spec.X509EncodedKeySpec;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/** The Ed25519 public keys a resource trusts, by key id. Immutable once built. */
public final class KeyRing {
  /** The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): 32 key bytes follow. */
  private static final byte[] X509_PREFIX = HexFormat.of().parseHex("302a300506032b6570032100");

  /** One key of the {@code GET /v1/keys} listing; {@code status} is null from older servers. */
  public record Listed(String keyId, String alg, String publicKey, String status) {}

  private final Map<String, PublicKey> keys;

  private KeyRing(Map<String, PublicKey> keys) {
    this.keys = Map.copyOf(keys);
  }

  /**
   * A ring trusting exactly {@code publicKeys} (32 raw bytes each). A key that is not a
   * point of large order is refused.
   */
  public static KeyRing of(List<byte[]> publicKeys) {
    Map<String, PublicKey> keys = new HashMap<>();
    for (byte[] raw : publicKeys) {
      keys.put(keyIdOf(raw), publicKey(raw));
    }
    return new KeyRing(keys);
  }

  /**
   * The ring {@code GET /v1/keys} describes: every Ed25519 key whose status is active or
   * verifying (or absent), each checked against its listed id. A retired key, or a status
   * or algorithm this version does not know, is left out: unknown fails closed.
   *
   * @throws IllegalArgumentException when a trusted key is not 32 bytes of base64url, not
   *     a point of large order, or listed under another id than its own
   */
  public static KeyRing fromListing(List<Listed> listing) {
    Map<String, PublicKey> keys = new HashMap<>();
    for (Listed key : listing) {
      String status = key.status();
      boolean trusted = status == null || status.equals("active") || status.equals("verifying");
      if (!trusted || !"Ed25519".equals(key.alg())) {
        continue;
      }
      byte[] raw = Base64Url.decode(key.publicKey());
      if (raw == null || raw.length != 32) {
        throw new IllegalArgumentException(
            "key \"" + key.keyId() + "\": not 32 bytes of base64url");
      }
      String id = keyIdOf(raw);
      if (!id.equals(key.keyId())) {
        throw new IllegalArgumentException(
            "key \"" + key.keyId() + "\" is listed under the wrong id (its id is \"" + id + "\")");
      }
      keys.put(id, publicKey(raw));
    }
    return new KeyRing(keys);
  }

  /** A public key's id: the first 8 bytes of its SHA-256, in lowercase hex. */
  public static String keyIdOf(byte[] publicKey) {
    try {
      byte[] sum = MessageDigest.getInstance("SHA-256").digest(publicKey);
      return HexFormat.of().formatHex(sum, 0, 8);
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("this JDK has no SHA-256", e);
    }
  }

  /** How many keys are trusted. */
  public int size() {
    return keys.size();
  }

  /** Whether {@code keyId} is trusted. */
  public boolean trusts(String keyId) {
    return keys.containsKey(keyId);
  }

  PublicKey get(String keyId) {
    return keys.get(keyId);
  }

  private static PublicKey publicKey(byte[] raw) {
    if (raw.length != 32) {
      throw new IllegalArgumentException("a public key is 32 bytes, not " + raw.length);
    }
    if (SmallOrder.test(raw)) {
      throw new IllegalArgumentException("the public key is not a point of large order");
    }
    byte[] der = new byte[X509_PREFIX.length + 32];
    System.arraycopy(X509_PREFIX, 0, der, 0, X509_PREFIX.length);
    System.arraycopy(raw, 0, der, X509_PREFIX.length, 32);
    try {
      return KeyFactory.getInstance("Ed25519").generatePublic(new X509EncodedKeySpec(der));
    } catch (GeneralSecurityException e) {
      throw new IllegalArgumentException("not an Ed25519 public key", e);
    }
  }

  /** Strict base64url without padding, shared with the verifier. */
  static final class Base64Url {
    private Base64Url() {}

    /**
     * The bytes of {@code text}, or null unless it is base64url without padding in its one
     * canonical spelling (the JDK's decoder accepts padding and stray low bits; the format
     * allows neither, so the decoded bytes must encode back to the same text).
     */
    static byte[] decode(String text) {
      if (!Ascii.alphanumericOr(text, "-_")) {
        return null;
      }
      byte[] raw;
      try {
        raw = Base64.getUrlDecoder().decode(text.getBytes(StandardCharsets.US_ASCII));
      } catch (IllegalArgumentException e) {
        return null;
      }
      String again = Base64.getUrlEncoder().withoutPadding().encodeToString(raw);
      return again.equals(text) ? raw : null;
    }
  }
}
