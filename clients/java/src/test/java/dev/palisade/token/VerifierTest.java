// The verifier against every vector of vectors/tokens.json and the strict rules.
package dev.palisade.token;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import dev.palisade.Vectors;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.Signature;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.Test;

class VerifierTest {
  /**
   * The token test vectors (made by the Rust signer): every vector's outcome, and a valid
   * one's claims. A class this test does not know fails it, so a vector class added to the
   * file is run here too.
   */
  @Test
  void everyVector() throws Exception {
    JsonNode file = Vectors.read("tokens.json");
    List<byte[]> trusted = new ArrayList<>();
    for (JsonNode key : file.get("keys")) {
      if (key.get("trusted").asBoolean()) {
        byte[] raw = Base64.getUrlDecoder().decode(key.get("public_key").asText());
        assertEquals(key.get("key_id").asText(), KeyRing.keyIdOf(raw));
        trusted.add(raw);
      }
    }
    Set<String> known = Set.of("valid", "malformed", "unknown_key", "bad_signature", "wrong_lock");
    for (JsonNode c : file.get("classes")) {
      assertTrue(known.contains(c.asText()), "a class this verifier does not know: " + c);
    }
    Verifier verifier = new Verifier(KeyRing.of(trusted), 16);
    int run = 0;
    for (JsonNode v : file.get("vectors")) {
      String name = v.get("name").asText();
      String expect = v.get("expect").asText();
      assertTrue(known.contains(expect), name + ": unknown class " + expect);
      try {
        Claims claims = verifier.verifyFor(v.get("token").asText(), v.get("lock").asText());
        assertEquals("valid", expect, name + ": admitted");
        JsonNode c = v.get("claims");
        assertEquals(
            new Claims(
                c.get("lock").asText(),
                c.get("epoch").bigIntegerValue().longValue(),
                c.get("holder").asText(),
                c.get("key_id").asText()),
            claims,
            name);
      } catch (TokenException refused) {
        assertEquals(expect, refused.refusal(), name + ": " + refused.getMessage());
      }
      run++;
    }
    assertTrue(run >= 20, "only " + run + " vectors");
  }

  /** The ring GET /v1/keys describes: retired and unknown statuses left out, ids checked. */
  @Test
  void aListingTrustsActiveAndVerifyingKeysOnly() throws Exception {
    KeyPair a = generate();
    KeyPair b = generate();
    KeyPair c = generate();
    List<KeyRing.Listed> listing =
        List.of(
            listed(a, "active"), listed(b, "verifying"), listed(c, "retired"), listed(generate(), "someday"));
    KeyRing ring = KeyRing.fromListing(listing);
    assertEquals(2, ring.size());
    assertTrue(ring.trusts(KeyRing.keyIdOf(raw(a))));
    assertTrue(ring.trusts(KeyRing.keyIdOf(raw(b))));
    assertFalse(ring.trusts(KeyRing.keyIdOf(raw(c))));
    KeyRing.Listed misnamed =
        new KeyRing.Listed("0000000000000000", "Ed25519", b64(raw(a)), "active");
    assertThrows(IllegalArgumentException.class, () -> KeyRing.fromListing(List.of(misnamed)));
  }

  /** A token of a key the ring no longer trusts is refused, cached or not. */
  @Test
  void aReplacedRingRefusesCachedTokens() throws Exception {
    KeyPair pair = generate();
    KeyRing ring = KeyRing.of(List.of(raw(pair)));
    String id = KeyRing.keyIdOf(raw(pair));
    String token = sign(pair.getPrivate(), new Claims("orders", 3, "w", id));
    Verifier verifier = new Verifier(ring, 8);
    assertEquals(3, verifier.verify(token).epoch());
    verifier.setKeys(KeyRing.of(List.of()));
    assertThrows(TokenException.UnknownKey.class, () -> verifier.verify(token));
  }

  /**
   * The eight points of small order, in every encoding of them, are refused as keys; a
   * signature whose R is one of them is refused; a genuine key is trusted.
   */
  @Test
  void smallOrderPointsAreRefused() throws Exception {
    List<String> torsion =
        List.of(
            "0100000000000000000000000000000000000000000000000000000000000000",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0000000000000000000000000000000000000000000000000000000000000080",
            "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
            "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
            // y = p + 1 and y = p: non-canonical spellings of the identity and of (±i, 0)
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f");
    for (String hex : torsion) {
      byte[] point = HexFormat.of().parseHex(hex);
      assertTrue(SmallOrder.test(point), hex);
      assertThrows(IllegalArgumentException.class, () -> KeyRing.of(List.of(point)), hex);
    }
    KeyPair pair = generate();
    assertFalse(SmallOrder.test(raw(pair)));
    KeyRing ring = KeyRing.of(List.of(raw(pair)));
    String token = sign(pair.getPrivate(), new Claims("orders", 1, "w", KeyRing.keyIdOf(raw(pair))));
    int dot = token.lastIndexOf('.');
    byte[] signature = Base64.getUrlDecoder().decode(token.substring(dot + 1));
    System.arraycopy(HexFormat.of().parseHex(torsion.get(0)), 0, signature, 0, 32);
    String forged = token.substring(0, dot + 1) + b64(signature);
    assertThrows(TokenException.BadSignature.class, () -> new Verifier(ring, 0).verify(forged));
  }

  /** A signature whose s is not below the group order is refused (s + L is the same scalar). */
  @Test
  void aNonCanonicalScalarIsRefused() throws Exception {
    KeyPair pair = generate();
    KeyRing ring = KeyRing.of(List.of(raw(pair)));
    String token = sign(pair.getPrivate(), new Claims("orders", 5, "w", KeyRing.keyIdOf(raw(pair))));
    Verifier verifier = new Verifier(ring, 0);
    assertEquals(5, verifier.verify(token).epoch());
    int dot = token.lastIndexOf('.');
    byte[] signature = Base64.getUrlDecoder().decode(token.substring(dot + 1));
    BigInteger order =
        BigInteger.TWO.pow(252).add(new BigInteger("27742317777372353535851937790883648493"));
    byte[] s = reverse(Arrays.copyOfRange(signature, 32, 64));
    byte[] sPlusL = new BigInteger(1, s).add(order).toByteArray();
    byte[] padded = new byte[32];
    System.arraycopy(sPlusL, Math.max(0, sPlusL.length - 32), padded, 32 - Math.min(32, sPlusL.length), Math.min(32, sPlusL.length));
    System.arraycopy(reverse(padded), 0, signature, 32, 32);
    String edited = token.substring(0, dot + 1) + b64(signature);
    assertThrows(TokenException.BadSignature.class, () -> verifier.verify(edited));
  }

  /** The escapes of the canonical form, character by character (docs/token-format.md). */
  @Test
  void canonicalStrings() {
    byte[] got =
        Verifier.canonicalPayload(
            new Claims("a", -1L, "\"\\\b\t\n\f\r\u0001\u001f/\u007fé", "k"));
    String want =
        "{\"l\":\"a\",\"e\":18446744073709551615,\"h\":\"\\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f/\u007fé\",\"k\":\"k\"}";
    assertArrayEquals(want.getBytes(StandardCharsets.UTF_8), got);
  }

  @Test
  void lockNames() {
    for (String good : List.of("a", "orders", "A-b_c.9", "x".repeat(128))) {
      assertTrue(Verifier.validLockName(good), good);
    }
    for (String bad : List.of("", ".", "..", "a/b", "a b", "é", "x".repeat(129))) {
      assertFalse(Verifier.validLockName(bad), bad);
    }
  }

  static KeyPair generate() throws GeneralSecurityException {
    return KeyPairGenerator.getInstance("Ed25519").generateKeyPair();
  }

  /** The 32 raw bytes of a public key (its X.509 encoding ends with them). */
  static byte[] raw(KeyPair pair) {
    byte[] der = pair.getPublic().getEncoded();
    return Arrays.copyOfRange(der, der.length - 32, der.length);
  }

  static String sign(PrivateKey key, Claims claims) throws GeneralSecurityException {
    String signed = "pal1." + b64(Verifier.canonicalPayload(claims));
    Signature ed25519 = Signature.getInstance("Ed25519");
    ed25519.initSign(key);
    ed25519.update(signed.getBytes(StandardCharsets.US_ASCII));
    return signed + "." + b64(ed25519.sign());
  }

  private static KeyRing.Listed listed(KeyPair pair, String status) {
    return new KeyRing.Listed(KeyRing.keyIdOf(raw(pair)), "Ed25519", b64(raw(pair)), status);
  }

  private static String b64(byte[] raw) {
    return Base64.getUrlEncoder().withoutPadding().encodeToString(raw);
  }

  private static byte[] reverse(byte[] bytes) {
    byte[] out = new byte[bytes.length];
    for (int i = 0; i < bytes.length; i++) {
      out[i] = bytes[bytes.length - 1 - i];
    }
    return out;
  }
}
