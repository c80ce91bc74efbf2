// The one piece of curve arithmetic the JDK lacks: whether an encoded Edwards25519 point
// is of small order.
package dev.palisade.token;

import java.math.BigInteger;

/**
 * Whether a 32-byte encoded point is not a point of edwards25519 at all, or is of small
 * order (eight times it is the identity): what ed25519-dalek's {@code verify_strict}
 * refuses for the public key and for a signature's {@code R}, and what the Go and Python
 * verifiers refuse too.
 *
 * <p>Written by hand because the JDK's Ed25519 (JEP 339) exposes no point arithmetic and
 * does not make this check, and no small, well-kept Java library offers it without
 * bringing a whole provider. It runs on a key once when it is trusted and on {@code R}
 * once per token verified (the verifier caches), so plain {@link BigInteger} affine
 * arithmetic is enough: it is not constant-time, and needs not be, as both inputs are
 * public.
 */
final class SmallOrder {
  private static final BigInteger P = BigInteger.TWO.pow(255).subtract(BigInteger.valueOf(19));
  /** d = -121665 / 121666. */
  private static final BigInteger D =
      BigInteger.valueOf(-121665).multiply(BigInteger.valueOf(121666).modInverse(P)).mod(P);
  /** A square root of -1: 2^((p-1)/4). */
  private static final BigInteger SQRT_M1 =
      BigInteger.TWO.modPow(P.subtract(BigInteger.ONE).shiftRight(2), P);

  private SmallOrder() {}

  /** True when {@code encoded} is not a curve point, or is one of small order. */
  static boolean test(byte[] encoded) {
    if (encoded.length != 32) {
      return true;
    }
    BigInteger[] point = decompress(encoded);
    if (point == null) {
      return true;
    }
    for (int i = 0; i < 3; i++) {
      point = add(point, point);
    }
    return point[0].signum() == 0 && point[1].equals(BigInteger.ONE);
  }

  /**
   * The affine point of an encoding (little-endian y, the top bit x's sign), or null when
   * no x fits. y is reduced modulo p as curve25519-dalek does; the sign does not matter
   * here (P and -P have the same order).
   */
  private static BigInteger[] decompress(byte[] encoded) {
    byte[] bigEndian = new byte[32];
    for (int i = 0; i < 32; i++) {
      bigEndian[i] = encoded[31 - i];
    }
    bigEndian[0] &= 0x7f;
    BigInteger y = new BigInteger(1, bigEndian).mod(P);
    BigInteger y2 = y.multiply(y).mod(P);
    BigInteger u = y2.subtract(BigInteger.ONE).mod(P);
    BigInteger v = D.multiply(y2).add(BigInteger.ONE).mod(P);
    BigInteger x2 = u.multiply(v.modInverse(P)).mod(P);
    BigInteger x = x2.modPow(P.add(BigInteger.valueOf(3)).shiftRight(3), P);
    if (!x.multiply(x).mod(P).equals(x2)) {
      x = x.multiply(SQRT_M1).mod(P);
      if (!x.multiply(x).mod(P).equals(x2)) {
        return null;
      }
    }
    return new BigInteger[] {x, y};
  }

  /** The twisted Edwards sum (a = -1), complete on this curve. */
  private static BigInteger[] add(BigInteger[] p, BigInteger[] q) {
    BigInteger xx = p[0].multiply(q[0]).mod(P);
    BigInteger yy = p[1].multiply(q[1]).mod(P);
    BigInteger dxy = D.multiply(xx).multiply(yy).mod(P);
    BigInteger x = p[0].multiply(q[1]).add(p[1].multiply(q[0]));
    BigInteger y = yy.add(xx);
    return new BigInteger[] {
      x.multiply(BigInteger.ONE.add(dxy).modInverse(P)).mod(P),
      y.multiply(BigInteger.ONE.subtract(dxy).mod(P).modInverse(P)).mod(P)
    };
  }
}
