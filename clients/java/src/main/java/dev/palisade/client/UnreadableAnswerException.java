// An answer that is not a Palisade error body: said as such, never given a guessed code.
package dev.palisade.client;

import java.io.IOException;

/**
 * An answer this client cannot read (a proxy's HTML page, an empty 404 from a wrong base
 * URL, a success without the fields it must carry): its status and the start of its body.
 */
public final class UnreadableAnswerException extends IOException {
  private static final long serialVersionUID = 1L;
  private final int status;

  UnreadableAnswerException(int status, String body) {
    super("HTTP " + status + " with a body that is not a Palisade answer: " + snippet(body));
    this.status = status;
  }

  /** The HTTP status of the answer. */
  public int status() {
    return status;
  }

  private static String snippet(String body) {
    return '"' + (body.length() > 200 ? body.substring(0, 200) : body) + '"';
  }
}
