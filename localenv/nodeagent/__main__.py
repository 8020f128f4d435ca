import sys

from localenv.nodeagent.cli import main

sys.exit(main())
