import streamlit as st
st.title("calibration")
