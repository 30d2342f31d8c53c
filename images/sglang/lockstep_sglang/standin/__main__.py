"""``python -m lockstep_sglang.standin <SGLang server argv>``: one stand-in pod."""

import sys

from lockstep_sglang.standin.pod import main

if __name__ == "__main__":
    sys.exit(main())
