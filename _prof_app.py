import cProfile, pstats, io, os, time
import streamlit as st
st.page_link = lambda *a, **k: None
pr = cProfile.Profile()
src = open("/work/wt-b/app.py").read()
t = time.perf_counter()
pr.enable()
try:
    exec(compile(src, "app.py", "exec"), {"__name__": "__main__"})
finally:
    pr.disable()
    st.session_state.setdefault("_times", []).append(time.perf_counter() - t)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    st.session_state["_prof"] = s.getvalue()
