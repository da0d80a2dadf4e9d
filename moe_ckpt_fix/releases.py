"""The release table: the one place a release of nvidia-modelopt or megatron-core is spelled in
harness/ and moe_ckpt_fix/ (tests/test_architecture.py checks it). Everything else imports
these names.

Why here, in the fix's package: ``moe_ckpt_fix`` is installed alone (the moe-ckpt-fix wheel)
and imports nothing of the harness, while the harness imports it; a table both read can only
live on this side. It imports nothing.
"""

# --- nvidia-modelopt ------------------------------------------------------------------------
LAST_SHARED = "0.46.1"  # the last release writing one shared weight-quantizer amax per grouped linear
SHARED_SERIES = "0.46.x"  # its series (the label of its rule)
LAST_BUGGY = "0.47.0"  # per-expert amax, refused at TP != ETP and lost on reload: the fix's target
FIRST_FIXED = "0.48.0rc1"  # fixed the per-expert amax itself (parts a-e of the fix)
SHARED_LAYOUT_RELEASES = f"<{LAST_BUGGY}"  # PEP 440: every release before the per-expert layout
DEFAULT_MATRIX = (LAST_SHARED, LAST_BUGGY, FIRST_FIXED)  # `make matrix` without MODELOPT=

# --- megatron-core ----------------------------------------------------------------------------
REFERENCE_MCORE = "0.19.2"  # every run before pairs were recorded used it; the default pair's
DECORATOR_ERA_READ = "0.15.3"  # the < 0.16 release whose sources were read
GROUPS_ERA_READ = "0.16.1"  # the 0.16 release whose sources were read
# One megatron-core release per band whose sources were read (harness/golden/forecast.py pairs).
READ_MCORE = (DECORATOR_ERA_READ, GROUPS_ERA_READ, REFERENCE_MCORE)
# Every release the harness was run against (harness/machine.py: others need an override).
SUPPORTED_MCORE = ("0.15.0", "0.15.1", "0.15.2", DECORATOR_ERA_READ, "0.16.0", GROUPS_ERA_READ,
                   REFERENCE_MCORE)
DEFAULT_MCORE_MATRIX = (REFERENCE_MCORE,)  # `make matrix` without MCORE=
# Bands (PEP 440 specifiers, "||" between alternatives) whose sources differ where it matters
# (harness/check/versions.py says what each does).
MCORE_DECORATOR_ERA = "==0.15.*"
MCORE_GROUPS_ERA = f"==0.16.* || =={REFERENCE_MCORE}"
NEEDS_COMMON_PT = "==0.15.* || ==0.16.*"  # megatron-core releases that need a common.pt
MTP_EMBEDDING_READ = f"=={REFERENCE_MCORE}"  # where the MTP position-embedding defect was read

# --- the fix (moe_ckpt_fix) -------------------------------------------------------------------
SUPPORTED_MODELOPT_VERSION = LAST_BUGGY  # every part, proven on a GPU
# Where its premise holds (per-expert amax take the DENSE TP rank: megatron-core >= 0.16, no
# expert_dist_ckpt_decorator); 0.19.2 is checked on the GPU, 0.16.x by the same source lines.
SUPPORTED_MCORE_VERSIONS = ("0.16.0", GROUPS_ERA_READ, REFERENCE_MCORE)
