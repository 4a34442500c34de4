import streamlit as st
st.title("workload")
