import sys

from twinserve.cli import main

sys.exit(main())
