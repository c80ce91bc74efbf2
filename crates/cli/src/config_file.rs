//! `palisade serve --config FILE`: settings from a TOML file, below the environment and
//! the flags.
//!
//! Each key of the file is a flag of `serve` without its leading `--`, and takes what the
//! flag takes: a string or a number, `true`/`false` for a switch, an array for a flag that
//! may be repeated. The file's settings are turned into flags and parsed by clap with the
//! rest, so every value is checked exactly as on the command line; a setting the command
//! line or the environment already gives is left out. contrib/palisade.toml is a commented
//! sample.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

/// Settings of the file that are not in the way of a flag or a variable, as flags for
/// `serve` (the subcommand `serve`, whose parsed flags are `given`).
pub fn flags_from_file(
    path: &Path,
    serve: &Command,
    given: &ArgMatches,
) -> Result<Vec<OsString>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| format!("config file {}: {}", path.display(), e.message().trim()))?;
    let mut flags = Vec::new();
    for (key, value) in &table {
        let arg = serve
            .get_arguments()
            .find(|a| {
                a.get_long() == Some(key.as_str()) && !FILE_ONLY_FLAGS.contains(&key.as_str())
            })
            .ok_or_else(|| {
                format!(
                    "config file {}: unknown setting {key:?} (the settings are the flags of \
                     `palisade serve --help` without their leading --, e.g. data-dir)",
                    path.display()
                )
            })?;
        if matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let flag = format!("--{key}");
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let bad = |what: &str| format!("config file {}: {key} must be {what}", path.display());
        match value {
            toml::Value::Boolean(on) if switch => {
                if *on {
                    flags.push(flag.into());
                }
            }
            _ if switch => return Err(bad("true or false")),
            toml::Value::Array(items) => {
                for item in items {
                    flags.push(flag.clone().into());
                    flags.push(scalar(item).ok_or_else(|| bad("an array of strings or numbers"))?);
                }
            }
            other => {
                flags.push(flag.into());
                flags.push(scalar(other).ok_or_else(|| bad("a string or a number"))?);
            }
        }
    }
    Ok(flags)
}

/// Flags that make no sense inside the file.
const FILE_ONLY_FLAGS: &[&str] = &["config", "print-config"];

fn scalar(value: &toml::Value) -> Option<OsString> {
    match value {
        toml::Value::String(s) => Some(s.into()),
        toml::Value::Integer(i) => Some(i.to_string().into()),
        _ => None,
    }
}

/// The settings in effect, as a config file: every flag of `serve` that has a value.
pub fn render(serve: &Command, matches: &ArgMatches) -> String {
    let mut table = toml::Table::new();
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if FILE_ONLY_FLAGS.contains(&long) {
            continue;
        }
        let id = arg.get_id().as_str();
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            toml::Value::Boolean(matches.get_flag(id))
        } else {
            let Some(raw) = matches.get_raw(id) else {
                continue;
            };
            let items: Vec<toml::Value> = raw.map(|v| typed(&v.to_string_lossy())).collect();
            match arg.get_action() {
                ArgAction::Append => toml::Value::Array(items),
                _ => match items.into_iter().next() {
                    Some(item) => item,
                    None => continue,
                },
            }
        };
        table.insert(long.to_owned(), value);
    }
    toml::to_string(&table).unwrap_or_default()
}

/// A number stays a number in the rendered file.
fn typed(text: &str) -> toml::Value {
    match text.parse::<i64>() {
        Ok(n) => toml::Value::Integer(n),
        Err(_) => toml::Value::String(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    /// Every setting of `serve` appears in the sample, set or commented out, and nothing
    /// else does.
    #[test]
    fn the_sample_shows_every_setting() {
        let sample = include_str!("../../../contrib/palisade.toml");
        let mut shown: Vec<&str> = sample
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
            .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            .collect();
        shown.sort_unstable();
        shown.dedup();
        let command = crate::command();
        let serve = command.find_subcommand("serve").unwrap();
        let mut flags: Vec<&str> = serve
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| !super::FILE_ONLY_FLAGS.contains(l))
            .collect();
        flags.sort_unstable();
        assert_eq!(shown, flags);
    }
}
