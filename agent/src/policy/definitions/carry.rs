//! What outlives one policy of the definition checks' refusals: those the registry's stored
//! definitions show (a new process or revision judges them before its first answer), and
//! those a policy taking over keeps of the one it replaces.

use std::sync::{Arc, PoisonError};

use super::Judged;
use crate::{config::DefinitionAction, policy::Policy};

impl Policy {
    /// Judges the definitions the registry holds for `server_id`, once per policy, before its
    /// refusals are first read: what an earlier listing hid stays hidden under a new process
    /// or revision until the server lists again (else a new revision or a restart would forget
    /// the tools `poisoning: hide` hid: `a_new_policy_refuses_what_the_stored_definitions_show`).
    /// Per server, when first asked about: judging the whole registry at every start costs
    /// seconds with thousands of servers. Only when a finding can refuse: under `alert` there
    /// is nothing to remember.
    pub(super) fn judge_stored(&self, server_id: &str) {
        if !self.definitions.refuses()
            || self
                .definition_state
                .judged
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(server_id)
        {
            return;
        }
        // One judge at a time: a second question waits for the answer, not past it.
        let _judging = self
            .definition_state
            .judging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self
            .definition_state
            .judged
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(server_id)
        {
            return;
        }
        match self.registry.definitions_of(server_id) {
            Ok(tools) if !tools.is_empty() => {
                let others = self.others(Some(server_id));
                self.findings_against(server_id, &tools, &others, Judged::Stored);
            }
            Ok(_) => {}
            // Judged on its next listing; a policy taking over keeps the refusals of the one
            // before (`take_over`).
            Err(error) => {
                tracing::error!(server_id, %error, "cannot read the registry's definitions to judge them")
            }
        }
        self.definition_state
            .judged
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server_id.to_owned());
    }

    /// What this policy keeps of `previous`'s listing verdicts when it replaces it
    /// (`policy/live.rs`): each refusal whose checks this policy refuses on too (a tool: one
    /// at `hide` or above; a server: one at `block_server`), until the server lists again —
    /// not judged again from the stored definition, which a later listing may not have
    /// replaced (a poisoned `_meta` leaves the hash, and so the stored row, as it was:
    /// `a_poison_outside_the_hashed_fields_is_remembered`). A listing `previous` finishes
    /// after the swap is judged here too.
    pub(crate) fn take_over(self: &Arc<Self>, previous: &Policy) {
        if !self.definitions.refuses() {
            return;
        }
        // First, so a listing `previous` flags after the copy below is forwarded here (its
        // write lock orders the two).
        let _ = previous.definition_state.successor.set(self.clone());
        self.carry(previous);
    }

    /// The copy of [`Policy::take_over`], without the forwarding: what the kernel's rules of
    /// a new revision are computed with before the swap (`daemon/bundle.rs`).
    pub(crate) fn carry(&self, previous: &Policy) {
        if !self.definitions.refuses() {
            return;
        }
        let before = previous
            .definition_state
            .flagged
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut flagged = self
            .definition_state
            .flagged
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for (key, flag) in before {
            let floor = match key.1 {
                None => DefinitionAction::BlockServer,
                Some(_) => DefinitionAction::Hide,
            };
            // Shadowing refuses only an undeclared server's twin of a declared server's tool:
            // judged with this policy's declarations (else a revision declaring the server
            // would keep it blocked until a restart, which judges it as allowed:
            // `a_shadowing_refusal_is_carried_only_while_the_new_declarations_make_it_one`).
            let refuses = |check: &&str| {
                self.definitions.action_of(check) >= floor
                    && (*check != "shadowing"
                        || (!self.declared.contains_key(&key.0)
                            && flag
                                .shadows
                                .as_deref()
                                .is_some_and(|s| self.declared.contains_key(s))))
            };
            if flag.checks.iter().any(refuses) {
                flagged.entry(key).or_insert(flag);
            }
        }
    }
}
