"""compare.py CAND_PREFIX [REF_PREFIX] [-v]: max/mean |dp| of CAND (S-line files <prefix><model>_<name>.txt,
from peer-logprobs or the minfer-engine `precision` example) over the top-5 ids of the reference:
the shared oracle fixtures by default, or another set of S-line files."""
import json,math,sys,glob,os
args=[a for a in sys.argv[1:] if a!='-v']
cand=args[0]; refp=args[1] if len(args)>1 else None
orc={}
for fn in glob.glob(os.path.join(os.path.dirname(__file__), '../../crates/engine/tests/fixtures/*.jsonl')):
    for l in open(fn):
        r=json.loads(l); orc[f"{r['model'][:4]}_{r['name']}"]=r
def load(p):
    out={}
    for l in open(p):
        ln=l.split()
        if ln[0]!='S': continue
        out[int(ln[1])]=[(int(ln[2+2*j]),float(ln[3+2*j])) for j in range((len(ln)-2)//2)]
    return out
tot={}
for key,r in sorted(orc.items()):
    try: c=load(f"{cand}{key}.txt")
    except FileNotFoundError: continue
    ref={k:s['top'] for k,s in enumerate(r['steps'])} if refp is None else {k:v[:5] for k,v in load(f"{refp}{key}.txt").items()}
    worst=(0,None)
    for k in sorted(c):
        if k not in ref: continue
        cd=dict(c[k])
        for id_,lp in ref[k]:
            if id_ not in cd: print("missing",key,k,id_); continue
            d=abs(math.exp(cd[id_])-math.exp(lp))
            m=key[:4]; t=tot.setdefault(m,[0,0,0,None]); t[0]+=d; t[1]+=1
            if d>t[2]: t[2]=d; t[3]=(key,k,id_,round(math.exp(lp),4),round(math.exp(cd[id_]),4))
            if d>worst[0]: worst=(d,k)
    if '-v' in sys.argv: print(f"{key}: {len(c)} steps, max {worst[0]:.4f} at step {worst[1]}")
for m,t in tot.items(): print(f"{m}: max {t[2]:.4f} mean {t[0]/t[1]:.5f} n {t[1]} worst {t[3]}")
