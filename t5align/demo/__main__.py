"""`python -m t5align.demo`: see `t5align.demo.command` for the usage."""
from t5align.demo import command

if __name__ == '__main__':
  command.main()
