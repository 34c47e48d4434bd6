//! `completions` and `man`: generated from the clap definition, so they
//! never drift from `--help`.

use clap::CommandFactory;
use clap_complete::Shell;

use super::exit::{self, Failure};
use super::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: Shell) -> Result<u8, Failure> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "quorumlock", &mut buf);
    write(&buf)
}

/// Writes the man page (roff) to stdout: the top page, then one section
/// per subcommand with its synopsis, description and options, as its
/// `--help` has them.
pub fn man() -> Result<u8, Failure> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut buf = Vec::new();
    render_man(&cmd, &mut buf)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot render the man page: {e}")))?;
    write(&buf)
}

fn render_man(cmd: &clap::Command, buf: &mut Vec<u8>) -> std::io::Result<()> {
    clap_mangen::Man::new(cmd.clone()).render(buf)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("quorumlock {}", sub.get_name());
        let page = clap_mangen::Man::new(sub.clone().bin_name(name.clone()));
        let mut roff = Vec::new();
        page.render_synopsis_section(&mut roff)?;
        page.render_description_section(&mut roff)?;
        page.render_options_section(&mut roff)?;
        // The subcommand's sections become subsections of its own.
        let roff = String::from_utf8_lossy(&roff).replace("\n.SH ", "\n.SS ");
        let roff = roff
            .strip_prefix(".SH ")
            .map_or(roff.clone(), |r| format!(".SS {r}"));
        buf.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
        buf.extend_from_slice(roff.as_bytes());
    }
    Ok(())
}

fn write(buf: &[u8]) -> Result<u8, Failure> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(buf).and_then(|()| out.flush()) {
        Ok(()) => Ok(exit::OK),
        // `| head` closed the pipe: not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(exit::OK),
        Err(e) => Err(Failure::new(
            exit::SOFTWARE,
            format!("writing to stdout: {e}"),
        )),
    }
}
