// How a lock's mark orders the operations a gate admits.
package dev.palisade.gate;

/** How a lock's mark orders the operations a gate admits. */
public enum Policy {
  /** Equal or larger epochs are admitted; smaller ones are refused (S8). */
  EPOCH,
  /** (epoch, seq) must also strictly increase with every operation. */
  SEQUENCE
}
