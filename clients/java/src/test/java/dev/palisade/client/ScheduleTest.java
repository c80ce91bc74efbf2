// The renewal schedule and its deadlines, with made-up clocks (the rules of _renewal.py).
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class ScheduleTest {
  private static final long MS = 1_000_000;

  /** {@code nanos} is {@code ms} milliseconds, give or take the rounding of a fraction. */
  private static void about(long ms, long nanos) {
    assertTrue(Math.abs(ms * MS - nanos) <= 1_000, nanos + " ns, not " + ms + " ms");
  }

  @Test
  void renewalsAreDueEveryThirdOfTheTtlAndMoveBothDeadlines() {
    Schedule s = new Schedule(900, 100_000 * MS, Deadlines.DEFAULT);
    about(100_300, s.due());
    about(100_600, s.renewBy());
    about(100_891, s.safeUntil());
    s.renewed(100_300 * MS, 900);
    about(100_600, s.due());
    about(100_900, s.renewBy());
    about(101_191, s.safeUntil());
    assertFalse(s.givenUp(100_899 * MS));
    assertTrue(s.givenUp(100_900 * MS));
  }

  @Test
  void theDeadlinesCountFromTheSendAndNeverTrustALongerTtl() {
    Schedule s = new Schedule(900, 0, Deadlines.DEFAULT);
    s.renewed(300 * MS, 60_000); // a server granting more is not believed
    about(900, s.renewBy());
    about(1_191, s.safeUntil());
  }

  @Test
  void failedRenewalsRetryQuicklyUntilTheRenewalDeadline() {
    Schedule s = new Schedule(1_500, 0, Deadlines.DEFAULT);
    s.failed(500 * MS);
    about(650, s.due());
    s.failed(950 * MS);
    about(1_000, s.due()); // never past the renewal deadline
    about(50, s.timeoutNanos(950 * MS));
    assertTrue(s.givenUp(1_000 * MS));
    // Given up, but what already runs may go on until the safe deadline.
    about(1_485, s.safeUntil());
  }

  @Test
  void aLeaseKnownToHaveEndedIsSafeNoLonger() {
    Schedule s = new Schedule(1_000, 0, Deadlines.DEFAULT);
    s.ended(400 * MS);
    assertEquals(400 * MS, s.safeUntil());
    s.ended(700 * MS); // never moves later
    assertEquals(400 * MS, s.safeUntil());
  }

  @Test
  void theDeadlinesFollowTheSettingsAndRefuseWhatCannotHold() {
    Schedule s = new Schedule(1_000, 0, new Deadlines(0.5, 0.1));
    about(500, s.renewBy());
    about(900, s.safeUntil());
    double[][] bad = {{1.0 / 3.0, 0.01}, {1.0, 0.01}, {0.7, 0.6}, {0.7, -0.1}, {Double.NaN, 0.01}, {0.7, Double.NaN}};
    for (double[] b : bad) {
      assertThrows(IllegalArgumentException.class, () -> new Deadlines(b[0], b[1]), b[0] + " " + b[1]);
    }
  }
}
