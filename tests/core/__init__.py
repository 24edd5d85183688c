"""The sans-IO core (redlock/_core/: RedlockCore and the flows it drives) without servers:
its protocols on scripted nodes (tests/scripted.py) and its pure rules, one file per
part of the core:

- test_rules.py: quorum, validity, the token rule, reply classification, LockState,
  validators (redlock/_core/: settings.py, tokens.py, state.py; replies read by
  redlock/_scripts/replies.py);
- test_acquire.py, test_extend.py: the acquire, release and extend protocols;
- test_line_protocol.py: the waiting line on the acquire path, and wake-ups;
- test_renewals.py: the auto-extend renewal loop;
- test_amnesia_detection.py, test_amnesia_maintenance.py, test_amnesia_repair.py,
  test_amnesia_initialise.py: node amnesia (docs/design.md §4) from its detection on
  the acquire path to repair and initialise();
- test_scripts_contract.py: the same script calls on scripted nodes and on a real
  redis-server, reply for reply and key for key, so that tests/scripted.py cannot drift
  from the Lua scripts it plays.

Behaviour on real nodes, both clients: the test files in tests/ itself.
"""
