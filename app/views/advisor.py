import streamlit as st
st.title("advisor")
