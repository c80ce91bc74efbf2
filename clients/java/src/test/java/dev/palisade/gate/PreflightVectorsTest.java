// The preflight vectors (vectors/preflight.json, made from the Rust rules in
// crates/adapters/src/preflight.rs) against this package's PostgreSQL rule.
package dev.palisade.gate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import dev.palisade.Vectors;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class PreflightVectorsTest {
  /**
   * {@link UnsafeDatabase#checkPostgres} gives every PostgreSQL case's verdict: each
   * unsafe setting with its value and what it needs, in the same order. A rule changed
   * here and not in the other gates fails this test.
   */
  @Test
  void theRuleGivesEveryVectorsVerdict() throws Exception {
    JsonNode file = Vectors.read("preflight.json");
    JsonNode cases = file.get("postgres");
    assertFalse(cases.isEmpty(), "no PostgreSQL cases");
    int safe = 0;
    for (JsonNode c : cases) {
      UnsafeDatabase verdict = UnsafeDatabase.checkPostgres(
          c.get("fsync").asText(),
          c.get("synchronous_commit").asText(),
          c.get("full_page_writes").asText(),
          c.get("synchronous_standby_names").asText(),
          c.get("replicas").asLong());
      List<UnsafeDatabase.Setting> expected = new ArrayList<>();
      for (JsonNode s : c.get("unsafe")) {
        expected.add(new UnsafeDatabase.Setting(
            s.get("name").asText(), s.get("value").asText(), s.get("needs").asText()));
      }
      if (verdict == null) {
        safe++;
      }
      List<UnsafeDatabase.Setting> found = verdict == null ? List.of() : verdict.settings();
      assertEquals(expected, found, "case " + c);
    }
    assertTrue(safe > 0, "no safe case: the file would not notice a rule that refuses everything");
  }
}
