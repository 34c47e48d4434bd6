//! `quorumlock`: distributed locks from the shell, on any store.
//!
//! ```text
//! quorumlock lock [--timeout D] [--ttl D] [--grace D] NAME -- CMD [ARGS...]
//! quorumlock status [--json] NAME
//! quorumlock revoke NAME
//! quorumlock break --yes NAME
//! ```
//!
//! Run `quorumlock --help` for the exit codes; the guide (`docs/guide.md`)
//! has the whole story.
#![deny(missing_docs)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
