//! `skill-lock mcp` (SPEC §2.9), driven by a client no one here wrote: the
//! Python `mcp` package's stdio client (tests/integration/mcp_client.py,
//! in the virtual environment `scripts/mcp-venv` makes, which `.ci/run`
//! calls), plus the raw protocol for the end of a session (input closed,
//! SIGTERM) and the bytes on the wire (harness/mcp.rs).
//!
//! The Python tests skip, saying SKIPPED, only when the environment is
//! missing and CI is not set; under CI=true a missing environment fails.
//!
//! Covers: SPEC §2.9, §2.1, §2.2, §2.3, §2.6, §6, §9.

use crate::harness::TestEnv;
use crate::harness::mcp::{Raw, plugin_entry, scenario, status_state};

#[test]
fn mcp_lists_the_five_tools_with_their_schemas_and_rules() {
    scenario("tools");
}

#[test]
fn mcp_acquires_checks_renews_and_releases_the_lock_the_shell_sees() {
    scenario("cycle");
}

#[test]
fn mcp_two_servers_contend_for_one_lock() {
    scenario("contend");
}

#[test]
fn mcp_one_runs_fence_never_acts_on_another_runs_acquisition() {
    scenario("same_session");
}

#[test]
fn mcp_a_killed_servers_lock_is_taken_over_as_owner_dead() {
    scenario("killed");
}

#[test]
fn mcp_bad_arguments_get_the_commands_errors() {
    scenario("bad_arguments");
}

#[test]
fn mcp_a_server_whose_input_closes_releases_at_once() {
    let env = TestEnv::new();
    let root = env.git_repo("checkout");
    let mut raw = Raw::start(&root);
    let acquired = raw.acquire(&root);
    assert_eq!(acquired.result, "acquired", "{acquired:?}");
    // The owner is the server's own process.
    assert_eq!(acquired.owner_pid, Some(u64::from(raw.pid())));
    assert_eq!(status_state(&root), "held");
    raw.close_input();
    assert!(
        raw.wait_exit(),
        "the server exits 0 at the end of its input"
    );
    // Released, not left to its hour-long lease.
    assert_eq!(status_state(&root), "free");
    raw.assert_no_token(&acquired.token_sha256);
}

#[test]
fn mcp_a_server_ended_by_sigterm_releases_first() {
    let env = TestEnv::new();
    let root = env.git_repo("checkout");
    let mut raw = Raw::start(&root);
    let acquired = raw.acquire(&root);
    assert_eq!(acquired.result, "acquired", "{acquired:?}");
    let pid = i32::try_from(raw.pid()).unwrap();
    // SAFETY: kill(2) on our own child, with a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(raw.wait_exit(), "the server exits 0 on SIGTERM");
    assert_eq!(status_state(&root), "free");
    raw.assert_no_token(&acquired.token_sha256);
}

/// The `mcpServers` entry a plugin ships starts `skill-lock mcp` through
/// uvx from the plugin's own directory, with no shell: no `~`, no `$HOME`,
/// nothing a shell would have to expand but `${CLAUDE_PLUGIN_ROOT}`.
#[test]
fn mcp_the_plugins_server_entry_needs_no_shell() {
    let entry = plugin_entry();
    assert_eq!(entry.command, "uvx", "{entry:?}");
    assert_eq!(
        entry.args,
        [
            "--from",
            "${CLAUDE_PLUGIN_ROOT}/skill-lock",
            "skill-lock",
            "mcp"
        ]
    );
    assert!(
        !entry.text.contains('~') && !entry.text.contains("$HOME"),
        "{entry:?}"
    );
    assert_eq!(
        entry.launcher,
        "uvx --from ${CLAUDE_PLUGIN_ROOT}/skill-lock skill-lock"
    );
}
