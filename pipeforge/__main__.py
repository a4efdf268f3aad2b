import sys

from pipeforge.cli import main

sys.exit(main())
