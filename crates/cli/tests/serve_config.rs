//! `serve --config FILE`: the file's settings sit below the environment and the flags;
//! the sample in contrib/ parses, every setting it shows (uncommented) is accepted, and
//! the defaults it quotes are the real ones. Also: completions and man pages generate.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::BIN;

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/palisade.toml");

/// `palisade serve ARGS --print-config` with `env`, parsed.
fn effective(args: &[&str], env: &[(&str, &str)]) -> toml::Table {
    let out = print_config(args, env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("the output is TOML")
}

fn print_config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.arg("serve").args(args).arg("--print-config");
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("PALISADE_")) {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run palisade")
}

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("palisade.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn flags_beat_the_environment_which_beats_the_file_which_beats_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "max-value-bytes = 100\nlock-delay-ms = 7\npolicy = [\"a=sequence\", \"b*=epoch\"]\n",
    );
    let get = |t: &toml::Table, k: &str| t[k].clone();
    let defaults = effective(&[], &[]);
    assert_eq!(
        get(&defaults, "max-value-bytes").as_integer(),
        Some(1_048_576)
    );

    let from_file = effective(&["--config", &file], &[]);
    assert_eq!(get(&from_file, "max-value-bytes").as_integer(), Some(100));
    assert_eq!(get(&from_file, "lock-delay-ms").as_integer(), Some(7));
    assert_eq!(
        get(&from_file, "policy").as_array().map(Vec::len),
        Some(2),
        "{from_file}"
    );

    let env = [("PALISADE_MAX_VALUE_BYTES", "200")];
    let from_env = effective(&["--config", &file], &env);
    assert_eq!(get(&from_env, "max-value-bytes").as_integer(), Some(200));
    assert_eq!(get(&from_env, "lock-delay-ms").as_integer(), Some(7));

    let from_flag = effective(&["--config", &file, "--max-value-bytes", "300"], &env);
    assert_eq!(get(&from_flag, "max-value-bytes").as_integer(), Some(300));

    // The config file can come from the environment too.
    let via_env = effective(&[], &[("PALISADE_CONFIG", &file)]);
    assert_eq!(get(&via_env, "max-value-bytes").as_integer(), Some(100));

    // The printed settings are themselves a config file that gives the same settings.
    let again = write(dir.path(), &toml::to_string(&from_flag).unwrap());
    assert_eq!(effective(&["--config", &again], &[]), from_flag);
}

#[test]
fn a_bad_file_is_a_usage_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    for (text, says) in [
        ("data_dir = \"x\"\n", "unknown setting \"data_dir\""),
        ("max-ttl-ms = \"soon\"\n", "max-ttl-ms"),
        ("insecure-no-auth = \"yes\"\n", "true or false"),
        ("listen = [\n", "config file"),
    ] {
        let file = write(dir.path(), text);
        let out = print_config(&["--config", &file], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(says), "{text}: {stderr}");
    }
    let out = print_config(&["--config", "/no/such/file.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_sample_parses_and_quotes_the_real_defaults() {
    let sample = effective(&["--config", SAMPLE], &[]);
    assert_eq!(sample["data-dir"].as_str(), Some("/var/lib/palisade"));

    // Every commented `# key = value` line, uncommented, is accepted...
    let text = std::fs::read_to_string(SAMPLE).unwrap();
    let commented: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.split_once(" = ")
                .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        })
        .collect();
    assert!(commented.len() > 30, "{commented:?}");
    let active: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" = "))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let everything = write(
        dir.path(),
        &format!("{}\n{}\n", active.join("\n"), commented.join("\n")),
    );
    let all = effective(&["--config", &everything], &[]);

    // ...and where a flag has a default, the sample quotes that default.
    let defaults = effective(&[], &[]);
    for line in &commented {
        let parsed: toml::Table = toml::from_str(line).unwrap();
        let (key, value) = parsed.iter().next().unwrap();
        assert_eq!(all.get(key), Some(value), "{line}");
        if let Some(default) = defaults.get(key) {
            assert_eq!(default, value, "the sample's {key} is not the default");
        }
    }
}

#[test]
fn completions_and_man_pages_are_generated() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bash = run(&["completions", "bash"]);
    assert!(bash.contains("palisade__subcmd__lock__subcmd__run"), "bash");
    assert!(run(&["completions", "zsh"]).contains("#compdef palisade"));
    assert!(run(&["completions", "fish"]).contains("complete -c palisade"));
    let man = run(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH palisade"),
        "{man}"
    );
    assert!(
        man.contains("Exit codes"),
        "the man page lists the exit codes"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    for page in [
        "palisade.1",
        "palisade-serve.1",
        "palisade-lock-run.1",
        "palisade-fence.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_default();
        assert!(text.contains(".TH"), "{page}");
    }
}

/// The server opts out of transparent huge pages (see `no_huge_pages` in main.rs): the
/// kernel reports the switch in the process's status.
#[cfg(target_os = "linux")]
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let server = common::Server::start(&[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) else {
        // Kernels before 6.0 do not report it; there is nothing to read.
        return;
    };
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}

/// `serve --help` groups its flags by topic, each flag under one heading.
#[test]
fn serve_help_is_grouped_by_topic() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let headings: Vec<&str> = help
        .lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
        .collect();
    for wanted in [
        "Listening and storage:",
        "Leases:",
        "Fenced store:",
        "etcd backend:",
        "Signing keys:",
        "Authentication and audit:",
        "Quotas:",
        "Events:",
        "Connections:",
        "TLS:",
        "Runtime:",
    ] {
        assert!(headings.contains(&wanted), "{wanted} in {headings:?}");
    }
    // Under the catch-all heading only the flags about the command itself.
    let options = help.split("Options:").nth(1).unwrap();
    let options = &options[..options.find("\n\n").unwrap_or(options.len())];
    let flags = options.matches("\n      --").count() + options.matches("\n  -").count();
    assert!(flags <= 4, "{options}");
}
