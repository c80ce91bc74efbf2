// What an admitted operation may rely on.
package dev.palisade.gate;

import dev.palisade.token.Claims;

/**
 * What an admitted operation may rely on, returned only once the new mark was written
 * inside the caller's transaction.
 *
 * @param claims the verified claims of the token
 * @param previous the mark before this operation
 * @param highWater the mark this operation commits together with the caller's writes
 */
public record Admitted(Claims claims, HighWater previous, HighWater highWater) {}
