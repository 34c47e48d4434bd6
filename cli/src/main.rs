//! `quorumlock`: distributed locks from the shell, on any store.
//!
//! ```text
//! quorumlock lock [-n | -w D] [-E N] [-s | --write | --permits N] NAME -- CMD [ARGS...]
//! quorumlock lock [OPTIONS] NAME -c 'SHELL COMMAND'
//! quorumlock elect NAME [VALUE] -- CMD [ARGS...] | quorumlock elect -l NAME
//! quorumlock status [--json] [--watch] NAME
//! quorumlock list [--json] [PREFIX]
//! quorumlock revoke NAME
//! quorumlock break --yes NAME
//! quorumlock completions SHELL | quorumlock man
//! ```
//!
//! The store is `--url` or `QUORUMLOCK_URL`; there is no default.
//!
//! Run `quorumlock --help` for the exit codes; the guide (`docs/guide.md`)
//! has the whole story.
#![deny(missing_docs)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
