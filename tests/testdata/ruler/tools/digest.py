"""Copies RULER records with each 'input' replaced by its sha256 ('input_sha256'), for records
whose text must not be stored (the essays). Usage: python digest.py IN_JSONL OUT_JSONL"""
import hashlib
import json
import sys


def digest(record: dict) -> dict:
  out = {k: v for k, v in record.items() if k != 'input'}
  out['input_sha256'] = hashlib.sha256(record['input'].encode('utf-8')).hexdigest()
  return out


def main(source: str, target: str):
  with open(source, encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  with open(target, 'w', encoding='utf-8') as f:
    for record in records:
      f.write(json.dumps(digest(record)) + '\n')


if __name__ == '__main__':
  main(*sys.argv[1:3])
