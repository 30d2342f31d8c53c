"""``python -m lockstep_standin <SGLang server argv>``: one stand-in pod."""

import sys

from lockstep_standin.pod import main

if __name__ == "__main__":
    sys.exit(main())
