import sys

from crosstalk.cli import main

sys.exit(main())
