//! `palisade completions SHELL` and `palisade man`: shell completions and man pages,
//! generated from the same clap definitions that parse the command line, so they cannot
//! disagree with it.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Flags of `palisade man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per command (palisade.1, palisade-serve.1, palisade-lock-run.1, ...)
    /// into this directory instead of printing palisade.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut command = crate::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "palisade", &mut script);
    crate::output::write_stdout(&script)
}

/// Prints `palisade.1`, or writes every page into `--dir`.
pub fn man(args: ManArgs) -> anyhow::Result<()> {
    let command = crate::command();
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            eprintln!("man pages written to {}", dir.display());
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("cannot render the man page")?;
            crate::output::write_stdout(&page)?;
        }
    }
    Ok(())
}
