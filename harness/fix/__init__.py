"""``harness.fix`` is the package ``moe_ckpt_fix`` (the repository root's ``moe_ckpt_fix/``, the
one copy of the fix, which ``make fix-wheel`` packs as the ``moe-ckpt-fix`` wheel), under the
name the harness has always used: ``import harness.fix; harness.fix.apply()``.

The same module object, not a copy of its names: a test that patches ``harness.fix`` patches
what ``apply()`` reads, and ``harness.fix.Refused`` is ``moe_ckpt_fix.Refused``. Its submodules
are imported as ``moe_ckpt_fix.<name>``. ``autoload/`` holds the environment route for a checkout.
"""
import sys

import moe_ckpt_fix

sys.modules[__name__] = moe_ckpt_fix
